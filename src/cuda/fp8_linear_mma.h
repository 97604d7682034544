// An FP8 × FP8 linear for few tokens on mma.sync (m16n8k16 f16, fp32 sums): both operands widened to
// f16 exactly, so every product is exact and the sums are fp32's, where the FP8 tensor cores (wgmma,
// cuBLASLt) sum each 32-wide K step with reduced precision. Tensor-parallel ranks that split K
// (o_proj) then differ from one GPU by fp32 rounding only. Partial sums over K splits go to
// `partial`; the caller adds them in split order and applies the scales (linear.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nibble::cuda {

inline constexpr int64_t kFp8MmaMaxTokens = 64;

struct Fp8MmaArgs {
  const uint8_t* x;  // FP8 e4m3 (tokens, k), rows 16-byte aligned
  const uint8_t* w;  // FP8 e4m3 (n, k), rows 16-byte aligned
  float* partial;    // (splits, tokens, n): Σ x·w over each split's K
  int64_t tokens;    // 1 .. kFp8MmaMaxTokens
  int64_t n;         // a multiple of 16
  int64_t k;         // a multiple of 16
  int splits;        // K splits of k_per_split (the last may be shorter, none empty)
  int64_t k_per_split;  // a multiple of 64
};

// Whether the kernel takes these sizes.
bool fp8_mma_supported(int64_t tokens, int64_t n, int64_t k);

// K splits for n channels and k: about four warps a channel tile and SM slot, 256 K a split at least.
int fp8_mma_splits(int64_t n, int64_t k, int num_sms, int64_t* k_per_split);

void fp8_linear_mma(const Fp8MmaArgs& args, cudaStream_t stream);

}  // namespace nibble::cuda
