// The W4A8 MoE layer on the GPU: route (softmax top-k) -> group tokens by expert -> FP8 per-token
// activations -> grouped INT4×FP8 gate_up GEMM -> SiLU·mul + FP8 quant -> grouped down GEMM ->
// weighted combine back to token order (the activation inside gate_up's epilogue where it runs in one
// K split, followed by the FP8 quantization of its output). One call runs the whole layer on one stream, with no host
// synchronization and no allocation (a CUDA graph can capture it). With many tokens per expert and
// outside a capture, the prefill path (moe_prefill.h) runs instead: dequantized experts and
// cuBLASLt FP8 GEMMs, with one host synchronization a call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "core/tensor.h"
#include "model/ops.h"
#include "cuda/moe_gemm_w4a8.h"
#include "cuda/moe_prefill.h"
#include "model/weights.h"

namespace nibble::cuda {

// Expert weights in the GEMM kernels' layout, on the device (see moe_gemm_w4a8.h for the layouts).
struct MoeWeightsW4A8 {
  ExpertWeightFormat format = ExpertWeightFormat::kInt4;
  int64_t num_experts = 0;
  int64_t hidden_size = 0;        // H
  int64_t intermediate_size = 0;  // I
  // U8 (E, 2I·H/2) repacked INT4 or (E, 2I·H) repacked FP8, gate and up rows interleaved by kGluRows
  // (moe_gemm_w4a8.h), so that gate_up's epilogue can apply the activation
  Tensor gate_up;
  Tensor gate_up_scale;  // F32 (E, 2I) in the same row order
  Tensor down;           // U8 (E, H·I/2) repacked INT4 or (E, H·I) repacked FP8
  Tensor down_scale;     // F32 (E, H)
  Tensor router;         // BF16 (E, H)
};

// From the CPU weights the loader produced (kInt4 in the on-disk reorder packing, or kFp8).
MoeWeightsW4A8 upload_moe_w4a8(const MoeWeights& host);

// Scratch memory for up to `max_tokens` tokens; reused by every call. Rows are (token, k) pairs in
// sorted (grouped by expert) order unless noted.
struct MoeWorkspace {
  MoeWorkspace(const MoeWeightsW4A8& w, int64_t max_tokens, int64_t top_k, PrefillOptions options = {});
  ~MoeWorkspace();
  MoeWorkspace(const MoeWorkspace&) = delete;
  MoeWorkspace& operator=(const MoeWorkspace&) = delete;

  int64_t max_tokens = 0;
  int64_t top_k = 0;
  int num_sms = 0;
  // The decode path's activation inside gate_up's epilogue (one K split) where the GEMM takes it
  // (moe_gemm_w4a8_fuses_glu: wgmma tiles of up to 16 rows), then the activation kernels' quantization
  // of it; false: gate_up's sums (over its K splits) then the activation kernels. Starts as
  // NIBBLE_MOE_FUSED_GLU (1 unless 0).
  bool fuse_activation = true;
  // With the fused activation, each row's amax over each warp tile too (GemmW4A8Args::glu_amax, into
  // glu_part_amax), where the activation takes its cluster kernel: that kernel then takes the row's
  // amax from the parts rather than from an exchange between its blocks; single GPU or each rank's own
  // amax (tp_local_amax) only. Starts as NIBBLE_MOE_GLU_AMAX (0 unless 1): not yet measured.
  bool glu_amax = false;
  // gate_up's K splits on the decode path when not fused; 0: choose_k_splits's (a test or an experiment
  // may fix it).
  int64_t gate_up_splits = 0;
  // cuBLAS for the router logits of many tokens (RouteArgs::blas), where the workspace takes
  // kTensorLogitsMinTokens tokens or more; owned.
  cublasHandle_t blas = nullptr;
  Tensor router_logits;   // F32 (T, E)
  Tensor topk_ids;        // I32 (T, K)
  Tensor topk_weights;    // F32 (T, K)
  Tensor expert_offsets;  // I32 (E + 1)
  Tensor active_experts;  // I32 (E + 1)
  Tensor sorted_tokens;   // I32 (T·K): the token of each row
  Tensor row_pos;         // I32 (T·K): the row of pair t·K + k
  Tensor route_done;      // I32 (kRouteCounters): zero between launches (moe_route.h: GroupArgs::blocks_done)
  Tensor x_fp8;           // F8_E4M3 (T, H), token order
  Tensor x_sorted;        // F8_E4M3 (T·K, H): x_fp8's rows in routed (sorted) order, for gate_up
  Tensor x_scale;         // F32 (T)
  Tensor x_sums;          // F32 (T, H / 64)
  Tensor gate_up_out;     // F32 (splits · T·K · 2I)
  Tensor act_fp8;         // F8_E4M3 (T·K, I)
  Tensor act_scale;       // F32 (T·K)
  Tensor act_amax;        // F32 (T·K): rows' amax over ranks under tensor parallelism
  Tensor glu_part_amax;   // F32 (rows the fused activation takes, I / 8): see glu_amax
  Tensor act_sums;        // F32 (T·K, I / 64)
  Tensor down_out;        // F32 (splits · T·K · H)
  // The prefill path's buffers: made with the workspace when max_tokens reaches the prefill threshold
  // (moe_prefill_preferred), else on the first call that forces the prefill path; null until then.
  PrefillOptions prefill_options;
  std::unique_ptr<MoePrefillWorkspace> prefill;
};

// Which implementation moe_w4a8 runs. kAuto: the prefill path when moe_prefill_preferred(T, K, E)
// and the stream is not being captured, else the decode path. Tests force one or the other.
enum class MoePath : uint8_t { kAuto, kDecode, kPrefill };

// Whether moe_w4a8's decode path for `tokens` fuses the activation into gate_up's epilogue.
bool moe_w4a8_fuses_activation(const MoeWeightsW4A8& w, const MoeWorkspace& ws, int64_t tokens, int64_t top_k);

// out (T, H) = MoE(x (T, H) BF16): BF16, or F32 (a tensor-parallel rank's partial sum, summed over
// the ranks before it is rounded). T <= workspace.max_tokens().
void moe_w4a8(const Tensor& x, const MoeWeightsW4A8& w, const MoeParams& params, MoeWorkspace& ws,
              Tensor& out, cudaStream_t stream, MoePath path = MoePath::kAuto);

}  // namespace nibble::cuda
