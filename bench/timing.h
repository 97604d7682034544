// Timing with CUDA events: warm-up first, then the median of many runs. A layer is timed as the
// engine runs it, as replays of a CUDA graph captured from its launch; when capture is refused,
// plainly.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "moe_variant.h"

namespace nibble::bench {

struct TimingOptions {
  int warmup = 3;
  int min_reps = 10;
  int max_reps = 200;
  double target_seconds =
      0.3;  // timed runs per measurement ≈ target / one run, clamped to the bounds
};

struct Measurement {
  double median_us = 0.0;
  double min_us = 0.0;
  int reps = 0;
  bool graph = false;  // true: graph replays; false: plain launches (capture refused, see note)
  std::string note;
};

// Event time of each of `reps` runs of `body` on `stream`, in microseconds.
std::vector<double> time_each(const std::function<void()>& body, cudaStream_t stream, int reps);

double median(std::vector<double> values);

// Captures `launch` into a graph and times its replays; falls back to plain launches if capture
// fails.
Measurement time_layer(const LayerLaunch& launch, cudaStream_t stream,
                       const TimingOptions& options);

}  // namespace nibble::bench
