// Row argmax (argmax.h): each thread scans a strided slice of its block's row, then the block
// reduces (value, index) pairs, the larger value or, on a tie, the lower index winning.
#include "cuda/argmax.h"

#include <cfloat>
#include <climits>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 512;

struct Best {
  float value;
  int index;
};

__device__ inline Best better(Best a, Best b) {
  return b.value > a.value || (b.value == a.value && b.index < a.index) ? b : a;
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* x, int64_t V, int32_t* out) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const float* row = x + blockIdx.x * V;
  Best best{-FLT_MAX, INT_MAX};
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = row[i];
    if (v > best.value || (v == best.value && i < best.index)) best = {v, static_cast<int>(i)};
  }
  for (int o = 16; o > 0; o /= 2)
    best = better(best, {__shfl_xor_sync(0xFFFFFFFFu, best.value, o), __shfl_xor_sync(0xFFFFFFFFu, best.index, o)});
  __shared__ Best warp_best[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = threadIdx.x < kThreads / 32 ? warp_best[threadIdx.x] : Best{-FLT_MAX, INT_MAX};
    for (int o = 16; o > 0; o /= 2)
      best = better(best, {__shfl_xor_sync(0xFFFFFFFFu, best.value, o), __shfl_xor_sync(0xFFFFFFFFu, best.index, o)});
    // A row of NaN and -inf only: index 0, as the host's std::max_element gives.
    if (threadIdx.x == 0) out[blockIdx.x] = best.index == INT_MAX ? 0 : best.index;
  }
}

}  // namespace

void argmax_rows(const Tensor& x, Tensor& out, cudaStream_t stream) {
  expect(x, DType::kF32, {-1, -1}, "argmax input");
  expect(out, DType::kI32, {x.dim(0)}, "argmax output");
  check(x.dim(1) >= 1 && x.dim(1) < INT_MAX, "argmax: ", x.dim(1), " values a row");
  if (x.dim(0) == 0) return;
  launch_kernel(argmax_kernel, static_cast<unsigned>(x.dim(0)), kThreads, 0, stream, x.data<float>(), x.dim(1),
                out.data<int32_t>());
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
