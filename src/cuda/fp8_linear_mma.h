// An FP8 × FP8 linear for few tokens on mma.sync (m16n8k16 f16, fp32 sums), scales applied: both
// operands widened to f16 exactly, so every product is exact and the sums are fp32's, where the FP8
// tensor cores (wgmma, cuBLASLt) sum each 32-wide K step with reduced precision. Tensor-parallel ranks
// that split K (o_proj) then differ from one GPU by fp32 rounding only. One kernel writes the output:
// each block's warps split K among them and add their sums in shared memory, in warp order, before
// the scales, so no partial sums leave the block and no scaling pass follows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nibble::cuda {

inline constexpr int64_t kFp8MmaMaxTokens = 64;

struct Fp8MmaArgs {
  const uint8_t* x;        // FP8 e4m3 (tokens, k), rows 16-byte aligned
  const uint8_t* w;        // FP8 e4m3 (n, k), rows 16-byte aligned
  const float* x_scale;    // (tokens)
  const float* w_scale;    // (n)
  void* out;               // (tokens, n): (Σ x·w) · x_scale[t] · w_scale[n], F32 or BF16 (rounded once)
  bool out_f32 = false;
  int64_t tokens = 0;  // 1 .. kFp8MmaMaxTokens
  int64_t n = 0;       // a multiple of 16
  int64_t k = 0;       // a multiple of 16
};

// Whether the kernel takes these sizes.
bool fp8_mma_supported(int64_t tokens, int64_t n, int64_t k);

void fp8_linear_mma(const Fp8MmaArgs& args, cudaStream_t stream);

}  // namespace nibble::cuda
