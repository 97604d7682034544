// One region of a run marked for Nsight Compute: under `ncu --profile-from-start off` only the kernels
// launched between profiler_start() and profiler_stop() are profiled (scripts/gpu-check's `profile`
// mode times every kernel of one decode step of `nibble bench-one-batch` this way).
#pragma once

namespace nibble::cuda {

void profiler_start();
void profiler_stop();  // waits for the device first, so the region's kernels all fall inside it

}  // namespace nibble::cuda
