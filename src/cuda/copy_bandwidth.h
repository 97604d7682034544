// Device-to-device copy bandwidth on this GPU, measured now: the ceiling every decode figure is
// divided by (DESIGN.md §7). Both the MoE benchmark and `nibble bench-one-batch` use it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nibble::cuda {

struct CopyBandwidth {
  double gb_per_s = 0.0;  // (bytes read + bytes written) / time, median of the timed runs; GB = 1e9
  int64_t bytes = 0;      // size of one copy
  int reps = 0;
};

// cudaMemcpyAsync of `bytes` between two device buffers of random data on `stream`, timed with CUDA
// events: 3 warm-up copies, then the median of `reps`. Allocates 2 × bytes for the measurement.
CopyBandwidth measure_copy_bandwidth(int64_t bytes, int reps, cudaStream_t stream);

}  // namespace nibble::cuda
