// The two library baselines of the MoE layer, on the same routing and inputs as nibble's layer:
// BF16 weights through cuBLAS, and FP8 W8A8 (per-expert weight scale, per-token activation scale)
// through cuBLASLt. Each does the same work as nibble: gather -> gate_up GEMM -> SiLU·mul (-> FP8
// quant) -> down GEMM -> weighted combine. Routing comes from the harness (routing.h), not a
// router.
#pragma once

#include <cstdint>
#include <memory>

#include "moe_variant.h"

namespace nibble::bench {

enum class GemmGrouping {
  kPerExpert,  // one cublasGemmEx per active expert and GEMM
  kGrouped,    // one cublasGemmGroupedBatchedEx per GEMM, one group per active expert
};

std::unique_ptr<MoeVariant> make_bf16_moe(const MoeShape& shape, int64_t max_tokens,
                                          GemmGrouping grouping, uint64_t seed);

// cuBLASLt 13.0 has no grouped FP8 GEMM, so this one is per expert.
std::unique_ptr<MoeVariant> make_fp8_moe(const MoeShape& shape, int64_t max_tokens, uint64_t seed);

}  // namespace nibble::bench
