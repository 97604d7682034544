// cudaProfilerStart/Stop behind profiler_range.h.
#include "cuda/profiler_range.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"

namespace nibble::cuda {

void profiler_start() { cuda_check(cudaProfilerStart()); }

void profiler_stop() {
  cuda_check(cudaDeviceSynchronize());
  cuda_check(cudaProfilerStop());
}

}  // namespace nibble::cuda
