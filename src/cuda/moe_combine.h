// The last step of the MoE layer: expert outputs back to token order, weighted by the router.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nibble::cuda {

struct CombineArgs {
  const float* down;          // (splits, max_rows, H) in sorted-row order
  const int32_t* row_pos;     // (T·K)
  const float* topk_weights;  // (T, K)
  void* out;                  // BF16 (T, H)
  int64_t tokens;
  int64_t top_k;
  int64_t hidden;
  int64_t splits;
  int64_t max_rows;
};

void moe_combine(const CombineArgs& args, cudaStream_t stream);

}  // namespace nibble::cuda
