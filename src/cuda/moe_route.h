// MoE routing on the GPU: router logits, optional soft-cap, softmax, top-k (ties to the lower expert
// id, as the CPU twin), optional renormalization; then the grouping of (token, k) pairs by expert
// that the grouped GEMM reads. Up to 512 experts and top-k 16.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/moe_quantize.h"
#include "model/ops.h"

namespace nibble::cuda {

inline constexpr int kMaxExperts = 512;
inline constexpr int kMaxTopK = 16;
// The one-launch routing's counters (GroupArgs::blocks_done): one for the grid, one a tile of tokens.
inline constexpr int64_t kRouteTileCounters = 128;
inline constexpr int64_t kRouteCounters = 1 + kRouteTileCounters;
// route_topk computes the logits of at least this many tokens on the tensor cores where it is given a
// cuBLAS handle (RouteArgs::blas): more than route_and_group's one launch takes, so that every
// routing of up to 1024 tokens (decode) keeps the logits of its CUDA-core kernels.
inline constexpr int64_t kTensorLogitsMinTokens = 1025;

struct RouteArgs {
  const void* x;          // BF16 (T, H)
  const void* router;     // BF16 (E, H)
  float* logits;          // (T, E)
  int32_t* topk_ids;      // (T, K)
  float* topk_weights;    // (T, K)
  int64_t tokens;
  int64_t hidden;
  int64_t experts;
  int64_t top_k;
  RouterNorm norm;
  float softcap;  // logits become softcap·tanh(logit / softcap) before the softmax; 0 = off
  // Set: route_topk takes the logits of kTensorLogitsMinTokens tokens or more from one cuBLAS BF16 GEMM
  // (fp32 sums, in cuBLAS's order: they may differ from the CUDA-core kernels' in the last bits).
  cublasHandle_t blas = nullptr;
};

void route_topk(const RouteArgs& args, cudaStream_t stream);

struct GroupArgs {
  const int32_t* topk_ids;   // (T, K)
  int32_t* expert_offsets;   // (E + 1)
  int32_t* active_experts;   // (E + 1): active ids in increasing order, their count at [E]
  int32_t* sorted_tokens;    // (T·K): token of each sorted row
  int32_t* row_pos;          // (T·K): sorted row of pair t·K + k: pairs keep their order within an expert
  int64_t tokens;
  int64_t experts;
  int64_t top_k;
  // (kRouteCounters) zero between launches, or nullptr: lets route_and_group route and group up to 1024
  // tokens in one launch (blocks count themselves done; the last ones take the top-k and group, and
  // reset the counters).
  uint32_t* blocks_done = nullptr;
};

void group_by_expert(const GroupArgs& args, cudaStream_t stream);

// route_topk then group_by_expert (group.topk_ids = route.topk_ids), with the same logits, top-k,
// weights and rows bit for bit in one launch for few tokens (tokens × experts <= 32) and, given
// group.blocks_done, for up to 1024 tokens. Given `quantize` (x's rows, dynamic scales, no gather,
// copies or tensor parallelism), quantize_rows_fp8(*quantize) too: inside that launch for up to 1024
// tokens (one launch fewer a layer; NIBBLE_MOE_QUANTIZE=kernel keeps it apart), else after it. Returns whether the quantization was inside: then the routing is the last
// launch before the caller's next, not two back.
bool route_and_group(const RouteArgs& route, const GroupArgs& group, cudaStream_t stream,
                     const QuantizeRowsArgs* quantize = nullptr);

}  // namespace nibble::cuda
