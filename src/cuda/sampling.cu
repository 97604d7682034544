// Row sampling (sampling.h): each thread scores a strided slice of its block's row, then the block
// reduces (score, index) pairs, the larger score or, on a tie, the lower index winning.
#include "cuda/sampling.h"

#include <climits>
#include <cmath>

#include "core/counter_rng.h"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 512;

struct Best {
  double score;
  int index;
};

__device__ inline Best better(Best a, Best b) {
  return b.score > a.score || (b.score == a.score && b.index < a.index) ? b : a;
}

__device__ inline Best shuffle_xor(Best b, int offset) {
  return {__shfl_xor_sync(0xFFFFFFFFu, b.score, offset), __shfl_xor_sync(0xFFFFFFFFu, b.index, offset)};
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, const float* temperatures, const int64_t* keys, int64_t V, int32_t* out) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const float* row = logits + blockIdx.x * V;
  const float t = temperatures[blockIdx.x];
  const auto key = static_cast<uint64_t>(keys[blockIdx.x]);
  Best best{-INFINITY, INT_MAX};
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const double score = t == 0.0f ? static_cast<double>(row[i]) : gumbel_score(row[i], t, key, i);
    if (score > -INFINITY) best = better(best, {score, static_cast<int>(i)});  // as the host's: NaN, -inf never win
  }
  for (int o = 16; o > 0; o /= 2) best = better(best, shuffle_xor(best, o));
  __shared__ Best warp_best[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = threadIdx.x < kThreads / 32 ? warp_best[threadIdx.x] : Best{-INFINITY, INT_MAX};
    for (int o = 16; o > 0; o /= 2) best = better(best, shuffle_xor(best, o));
    // A row of NaN and -inf only: 0, and so for a greedy row that starts with NaN (std::max_element).
    if (threadIdx.x == 0) out[blockIdx.x] = best.index == INT_MAX || (t == 0.0f && row[0] != row[0]) ? 0 : best.index;
  }
}

}  // namespace

void sample_rows(const Tensor& logits, const Tensor& temperatures, const Tensor& keys, Tensor& out,
                 cudaStream_t stream) {
  expect(logits, DType::kF32, {-1, -1}, "sample logits");
  const int64_t R = logits.dim(0), V = logits.dim(1);
  expect(temperatures, DType::kF32, {R}, "sample temperatures");
  expect(keys, DType::kI64, {R}, "sample keys");
  expect(out, DType::kI32, {R}, "sample output");
  check(V >= 1 && V < INT_MAX, "sample: ", V, " values a row");
  if (R == 0) return;
  launch_kernel(sample_kernel, static_cast<unsigned>(R), kThreads, 0, stream, logits.data<float>(),
                temperatures.data<float>(), keys.data<int64_t>(), V, out.data<int32_t>());
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
