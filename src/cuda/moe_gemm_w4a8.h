// Grouped INT4 × FP8 GEMM for MoE experts (the decode-oriented path): for each active expert e and
// each of its rows r (tokens routed to it, grouped by expert),
//   out[split][r][n] = act_scale[r] · scale[e][n] · Σ_{k in split} a[r][k] · v[e][n][k]
// with a the FP8 activation values and v the INT4 weight values. Weights stream once from memory,
// spread over all SMs (output channels on the 16-row side of the tensor-core tile, tokens on the
// 8-column side), split along K when the experts' channels alone cannot fill the GPU.
//
// Weight layout (made at load time by repack_int4_for_gemm): per expert, per 16-row tile, per 64-wide
// K block, 32 lanes × 16 bytes, so each lane's 16-byte load is exactly its mma.m16n8k32 A fragments
// for two K steps. Each value is stored as u = v + 8 in [0, 15], which read as an FP8 e4m3 byte is
// exactly u · 2^-9 (the subnormal and first normal binade are evenly spaced); the kernel turns 8
// nibbles into 8 FP8 operands with two logic ops, and corrects the offset with the activation sums:
//   Σ a·v = 2^9 · Σ a·(u · 2^-9) − 8 · Σ a.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"
#include "model/ops.h"

namespace nibble::cuda {

inline constexpr int kGemmKBlock = 64;  // K granularity of the layout and of the activation sums

// The MoE layer's gate_up rows, as uploaded (moe.h): gate and up interleaved by kGluRows, so that each
// 16-row tile holds 8 gate rows and the 8 up rows of the same channels, and a thread's accumulators
// hold both halves of its channel's activation (GemmW4A8Args::glu). Intermediate channel i is row
// 2·kGluRows·(i / kGluRows) + i % kGluRows (gate) and that + kGluRows (up).
inline constexpr int64_t kGluRows = 8;

// The expert weights' element type. FP8 weights use the same tiling with 32 bytes a lane per K block
// (both K steps' A fragments as stored, no offset correction); their activation sums are not read.
enum class ExpertWeightFormat : uint8_t { kInt4, kFp8 };

// The tensor-core instructions of the decode GEMM (INT4 weights, at most 16 rows a tile):
// kWgmma: one warpgroup's wgmma m64nNk32 e4m3 a 64-channel tile (the weights' nibbles as FP8 bytes).
// kMmaSync: each warp mma.sync m16n8k16 f16 over all 64 channels of one K block of the stage (the
// nibbles as f16 subnormals, the FP8 activations converted to f16, both exact; the four warps' partial
// sums added in shared memory at the end of a unit).
// kDefault: NIBBLE_MOE_MATH (wgmma or mma), else wgmma (moe_gemm_w4a8.cu: measured; mma.sync won
// for tiles of 8 rows until the twentieth session).
enum class GemmMath : uint8_t { kDefault, kWgmma, kMmaSync };

// codes: I32 (E, N, K/8) in the on-disk reorder packing (quant/int4.h), on the CPU.
// Returns U8 (E, N·K/2) in the kernel's layout, on the CPU. N % 16 == 0 and K % 64 == 0.
Tensor repack_int4_for_gemm(const Tensor& codes);
// The same on the GPU: codes I32 (E, N, K/8) on the device -> U8 (E, N·K/2) on the device.
Tensor repack_int4_for_gemm_gpu(const Tensor& codes);
// FP8 weights U8 (E, N, K) on the device -> U8 (E, N·K) in the kernel's FP8 layout, on the device.
// Per 16-row tile and 64-wide K block, lane (g = lane / 4, q = lane % 4) holds 8 words; word 4s + r
// holds row g + 8·(r & 1), columns 32s + 16·(r >> 1) + 4q .. + 3.
Tensor repack_fp8_for_gemm_gpu(const Tensor& codes);

struct GemmW4A8Args {
  ExpertWeightFormat weight_format;
  const void* weights;          // repacked (E, N·K/2), or (E, N·K) for FP8
  const float* weight_scale;    // (E, N)
  const uint8_t* act;           // FP8 (rows, K) — or indexed through act_row
  const float* act_scale;       // (activation rows)
  const float* act_sums;        // (activation rows, K / 64): Σ of FP8 values per K block (INT4 only)
  const int32_t* act_row;       // (T·K) sorted position -> activation row; nullptr: identity
  // The codes of act in sorted order (row r: act row act_row[r]), (max_rows, K): the wgmma tiles load
  // their activations from it with the tensor-memory accelerator; with act_row nullptr, act itself.
  const uint8_t* act_sorted = nullptr;
  const int32_t* expert_offsets;  // (E + 1) sorted rows of each expert
  const int32_t* active_experts;  // (E + 1) active expert ids, count at [E]
  float* out;                   // (splits, max_rows, N), rows in sorted order
  int64_t max_rows;             // T·K: the row capacity of one split of `out`
  int64_t num_experts;
  int64_t n;                    // N
  int64_t k;                    // K
  int64_t expert_slots;         // grid size over experts: min(E, T·K)
  int64_t splits;               // K splits; each covers a multiple of 64
  int prefetch_stages = 0;      // set by the launch: L2 prefetch distance past the pipeline, in stages
  int early_l2_stages = 0;      // set by the launch: stages past the pipeline asked of L2 before the
                                // grid dependency wait (routing_settled only)
  int leave_out = 0;            // set by the launch (timing experiments only): a sum of 1 the tensor-core
                                // math, 2 the activation copies, 4 the weight copies
  bool evict_first = false;     // set by the launch (NIBBLE_MOE_EVICT_FIRST, 1 by default): the weights'
                                // copies ask L2 to evict them first
  bool narrow_chains = false;   // set by the launch (NIBBLE_MOE_NARROW_CHAINS, 1 by default): tiles
                                // of 64 and 128 rows multiply only a chunk's live rows, rounded up to 32
  int consumer_groups = 0;      // wgmma consumer warpgroups a block, 1 or 2 (INT4 only); 0: the
                                // NIBBLE_MOE_CONSUMER_GROUPS setting, else by shape (as choose_k_splits)
  GemmMath math = GemmMath::kDefault;  // INT4 weights, tiles of up to 16 rows; otherwise wgmma
  int max_tile_rows = 0;        // 64 or 128 (INT4 only); 0: NIBBLE_MOE_MAX_TILE_ROWS, else 128
  // The activation fused into the epilogue (a gate_up projection in kGluRows-interleaved rows; wgmma
  // tiles, one split, moe_gemm_w4a8_fuses_glu): `out` receives (max_rows, N/2) act(gate) · up (F32, the
  // values the activation kernels compute from the unfused output, bit for bit), which
  // activation_quantize_fp8 then quantizes (ActivationArgs::activated).
  bool glu = false;
  Activation glu_activation = Activation::kSilu;
  // With glu: glu_amax (F32, max_rows × N/16) receives each row's amax of act(gate) · up over each
  // warp tile's 8 channels (ActivationArgs::part_amax), for the rows the routing fills; nullptr: none.
  float* glu_amax = nullptr;
  // The routing (expert_offsets, active_experts) was written two or more launches back in the stream
  // (launch.h), so the producer may start the first stages' weight copies before the kernel before
  // it has finished (the activations and their scales are read only after).
  bool routing_settled = false;
};

// Picks the K split for a problem so that the GPU is full; `rows` is T·K (routed pairs).
int64_t choose_k_splits(int64_t n, int64_t k, int64_t expert_slots, int64_t rows, int num_sms);

// Whether a call with `rows` (T·K) over `expert_slots` takes wgmma tiles, which read act_sorted (the
// default math; an INT4 call with mma.sync tiles reads act through act_row instead).
bool moe_gemm_w4a8_reads_sorted(ExpertWeightFormat format, int64_t rows, int64_t expert_slots);

// Whether a gate_up call with `rows` (T·K) over `expert_slots` takes the fused activation
// (GemmW4A8Args::glu, one K split) when asked: wgmma tiles of up to 16 rows. Measured on an H100
// (bench/RESULTS.md, twenty-sixth session, the layer, µs fused / apart, two rounds): Mixtral 32 tokens
// 263.5, 263.7 / 269.7, 269.6; Grok-1 tp 2 1 token 126.2, 126.6 / 129.1, 127.4; DeepSeek-V3 32 tokens
// 1235.6, 1234.3 / 1243.5, 1242.9; Mixtral 8 tokens 262.5, 262.8 / 261.1, 260.7; equal at Mixtral's and
// DeepSeek-V3's one token. In tiles of 64 and 128 rows its epilogue cost the tensor cores more than
// the activation kernel's pass (on an H200: Mixtral 256 tokens 545.1 against 483.2 µs, 1024 1369.1
// against 1362.1, even before a row amax in the epilogue, which cost 110 µs more at 1024).
bool moe_gemm_w4a8_fuses_glu(ExpertWeightFormat format, int64_t rows, int64_t expert_slots);

void moe_gemm_w4a8(const GemmW4A8Args& args, cudaStream_t stream);

}  // namespace nibble::cuda
