// Sampling penalties on the GPU: a block per row, its threads over the row's seen tokens (distinct, so
// no two threads write one logit).
#include "cuda/logit_penalties.h"

#include <climits>

#include "core/logit_penalties.h"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    penalize_kernel(float* logits, int64_t V, const int32_t* offsets, const int32_t* tokens, const int32_t* generated,
                    const float* bias, const float* penalties) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t r = blockIdx.x;
  const float repetition = penalties[r * 3], frequency = penalties[r * 3 + 1], presence = penalties[r * 3 + 2];
  float* row = logits + r * V;
  for (int32_t i = offsets[r] + static_cast<int32_t>(threadIdx.x); i < offsets[r + 1]; i += kThreads) {
    const int32_t t = tokens[i];
    if (t >= 0 && t < V) row[t] = penalized_logit(row[t], generated[i], bias[i], repetition, frequency, presence);
  }
}

}  // namespace

void penalize_rows(Tensor& logits, const PenaltySettings& settings, cudaStream_t stream) {
  expect(logits, DType::kF32, {-1, -1}, "penalize logits");
  const int64_t R = logits.dim(0), N = settings.tokens.numel();
  expect(settings.row_offsets, DType::kI32, {R + 1}, "penalize row_offsets");
  expect(settings.tokens, DType::kI32, {N}, "penalize tokens");
  expect(settings.generated, DType::kI32, {N}, "penalize generated");
  expect(settings.bias, DType::kF32, {N}, "penalize bias");
  expect(settings.penalties, DType::kF32, {R, 3}, "penalize penalties");
  check(N < INT_MAX && logits.dim(1) < INT_MAX, "penalize: ", N, " entries, ", logits.dim(1), " a row");
  if (R == 0 || N == 0) return;
  launch_kernel(penalize_kernel, static_cast<unsigned>(R), kThreads, 0, stream, logits.data<float>(), logits.dim(1),
                settings.row_offsets.data<int32_t>(), settings.tokens.data<int32_t>(),
                settings.generated.data<int32_t>(), settings.bias.data<float>(), settings.penalties.data<float>());
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
