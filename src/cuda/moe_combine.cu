// Weighted combine: out[t] (BF16) = Σ_k weight[t, k] · Σ_split down[split][row_pos[t, k]].
#include <cuda_bf16.h>

#include "cuda/cuda_check.h"
#include "cuda/moe_combine.h"

namespace nibble::cuda {
namespace {

__global__ void combine_kernel(const __grid_constant__ CombineArgs p) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int64_t row = p.row_pos[t * p.top_k + k];
      float y = 0.0f;
      for (int64_t s = 0; s < p.splits; ++s) y += p.down[(s * p.max_rows + row) * p.hidden + h];
      sum += p.topk_weights[t * p.top_k + k] * y;
    }
    static_cast<__nv_bfloat16*>(p.out)[t * p.hidden + h] = __float2bfloat16_rn(sum);
  }
}

}  // namespace

void moe_combine(const CombineArgs& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  combine_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
