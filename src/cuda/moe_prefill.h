// The MoE layer's prefill path (many tokens per expert): the active experts' weights dequantized
// from the kernel layout to plain FP8 in a bounded scratch (moe_dequant.h), the routed activations
// quantized to FP8 in expert-grouped order, one cuBLASLt FP8 GEMM per expert and matrix with an
// unscaled product (F32 for gate_up, BF16 by default for down), the scales applied by the consumers
// (activation_quantize_fp8 and moe_combine_rows). Eager only: one host synchronization a call reads
// the rows of each expert. Not the decode path: a CUDA graph keeps the grouped INT4 kernel.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/tensor.h"
#include "cuda/lt_fp8_gemm.h"
#include "model/ops.h"

namespace nibble::cuda {

struct MoeWeightsW4A8;
struct MoeWorkspace;

// The prefill path pays when an expert's rows fill cuBLASLt tiles: T·K / E at or above this.
// Measured on an H200 (bench/RESULTS.md, 2026-11-30, Mixtral's MoE layer): at 256 rows an expert
// (1024 tokens) the decode kernel took 1701 µs and this path 2499; at 1024 rows (4096 tokens) this
// path 4516 µs and the decode kernel 7434 (4695 with the eleventh session's 128-row tiles).
inline constexpr int64_t kPrefillMinRowsPerExpert = 512;
// Each expert's rows start at a multiple of this in the padded row space, so that every GEMM's
// operands are 256-byte aligned and row counts (GEMM plans) come in steps of 16.
inline constexpr int64_t kPrefillRowQuantum = 16;
// Per-expert GEMMs go round-robin to this many side streams: small experts (DeepSeek: 4096 × 128 ×
// 7168) fill only part of the GPU one at a time.
inline constexpr int kPrefillStreams = 4;

bool moe_prefill_preferred(int64_t tokens, int64_t top_k, int64_t experts);

struct PrefillOptions {
  int64_t weight_scratch_bytes = int64_t{1} << 30;  // dequantized experts: slots × 3·I·H bytes
  int64_t buffer_bytes = int64_t{2} << 30;          // the gate_up chunk buffer
  // The down product of consecutive chunks (a "window") stays until the window's combine pass: one
  // window for the whole call where it fits (BF16 at DeepSeek 32768 tokens: 3.8 GB), so that no
  // per-token running sums go through memory.
  int64_t down_bytes = int64_t{4} << 30;
  // The down GEMM's unscaled product: BF16 halves its traffic (DeepSeek at 32768 tokens: 15 -> 7.5
  // GB written and read) at the cost of one bf16 rounding (relative 2^-9) before the combine, the
  // same as the output's own; F32 also works.
  DType down_product = DType::kBF16;
  // The gate_up GEMM's unscaled product, F32 or BF16 (NIBBLE_MOE_GATE_UP_PRODUCT=bf16 or f32 overrides
  // it): BF16 halves the product's traffic, written by the GEMM and read by the activation, at the cost
  // of a bf16 rounding before SiLU·mul, which flips FP8 codes of the activations about 5× as often as
  // the GEMMs' own summation order does. Measured on an H200 (bench/RESULTS.md, twenty-third session):
  // the layer 4-5% faster (Mixtral 32768 tokens 22740.8 µs against 23922.0, Grok-1 tp 2 37141.5
  // against 39037.7), its relative L2 error against the CPU twin 1.47e-2 against 3.2e-3
  // (MoeLayerPrefill). So F32 stays the default.
  DType gate_up_product = DType::kF32;
};

// Rows are "padded rows": expert e's routed pairs at padded_offsets[e] .. + count, then padding up
// to the next multiple of kPrefillRowQuantum. Chunk buffers hold chunk_rows consecutive padded
// rows; the down product and activation scales hold a window of consecutive chunks.
struct MoePrefillWorkspace {
  MoePrefillWorkspace(int64_t experts, int64_t hidden, int64_t inter, int64_t max_tokens,
                      int64_t top_k, const PrefillOptions& options);
  ~MoePrefillWorkspace();
  MoePrefillWorkspace(const MoePrefillWorkspace&) = delete;
  MoePrefillWorkspace& operator=(const MoePrefillWorkspace&) = delete;

  // The cached plan for D (rows, out_features) = B (rows, in_features) · A (out_features,
  // in_features)ᵀ, D in `product` (F32 or BF16).
  LtFp8Gemm& plan(int64_t out_features, int64_t rows, int64_t in_features, DType product);

  int64_t slots = 0;        // experts the weight scratch holds
  int64_t chunk_rows = 0;   // padded rows a chunk buffer holds, a multiple of kPrefillRowQuantum
  int64_t window_rows = 0;  // padded rows the down product holds, at least chunk_rows
  Tensor gate_up_weights;   // F8_E4M3 (slots, 2I, H) row-major
  Tensor down_weights;      // F8_E4M3 (slots, H, I) row-major
  Tensor padded_offsets;    // I32 (E + 1)
  Tensor row_token;         // I32 (max padded rows): token of each padded row, -1 for padding
  Tensor row_expert;        // I32 (max padded rows): expert of each padded row, -1 for padding
  Tensor pair_row;          // I32 (T·K): padded row of pair t·K + k
  Tensor x_fp8;             // F8_E4M3 (chunk_rows, H)
  Tensor x_scale;           // F32 (chunk_rows)
  Tensor sums;        // F32 (chunk_rows · max(H, I) / 64): written by the quantizers, not read
  Tensor gate_up;     // F32 or BF16 (options.gate_up_product) (chunk_rows, 2I) unscaled
  Tensor act_fp8;     // F8_E4M3 (chunk_rows, I)
  Tensor act_scale;   // F32 (window_rows)
  Tensor act_amax;    // F32 (chunk_rows): rows' amax over ranks under tensor parallelism
  Tensor down;        // F32 or BF16 (options.down_product) (window_rows, H) unscaled
  Tensor acc;         // F32 (T, H): per-token sums when a call can take several windows, else none
  Tensor lt_scratch;  // U8 (kPrefillStreams, 32 MiB): cuBLASLt's workspace, one per side stream
  cublasLtHandle_t lt = nullptr;
  std::array<cudaStream_t, kPrefillStreams> streams{};    // non-blocking side streams
  std::array<cudaEvent_t, kPrefillStreams + 1> events{};  // [0] fork, [1 + i] join of streams[i]
  int32_t* host_offsets = nullptr;  // pinned (2·(E + 1)): expert offsets, then padded offsets
  std::map<std::tuple<int64_t, int64_t, int64_t, DType>, std::unique_ptr<LtFp8Gemm>> plans;
};

// The host-side plan of one prefill call. Padded rows are contiguous over the active experts (in id
// order); groups are runs of at most `slots` active experts, dequantized together; chunks split each
// group's padded rows into pieces of at most chunk_rows (multiples of kPrefillRowQuantum); windows
// are runs of consecutive chunks spanning at most window_rows.
struct PrefillChunk {
  int64_t group;         // index of the chunk's expert group
  int64_t begin, end;    // its padded rows
  int64_t window_begin;  // the first padded row of its window
};
struct PrefillPlan {
  std::vector<int64_t> active;  // expert ids with rows, increasing; group g is [g·slots, (g+1)·slots)
  std::vector<int32_t> padded_offsets;  // (E + 1)
  std::vector<PrefillChunk> chunks;
  int64_t windows = 0;
};
// expert_offsets: (E + 1) sorted rows of each expert (group_by_expert's output).
PrefillPlan plan_prefill(const int32_t* expert_offsets, int64_t experts, int64_t slots,
                         int64_t chunk_rows, int64_t window_rows);

// The prefill path of moe_w4a8 (moe.h), after routing: ws.topk_ids, topk_weights, expert_offsets
// and row_pos hold this call's routing; ws.prefill is made. Not inside a graph capture. out (T, H)
// BF16 or F32, as moe_w4a8's.
void moe_prefill(const Tensor& x, const MoeWeightsW4A8& w, const MoeParams& params,
                 MoeWorkspace& ws, Tensor& out, cudaStream_t stream);

}  // namespace nibble::cuda
