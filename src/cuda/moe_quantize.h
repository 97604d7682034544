// The two producers of grouped-GEMM inputs: per-token FP8 quantization of the layer input, and
// SiLU/GELU(gate) · up of the gate_up output followed by the same quantization. Each writes FP8 codes,
// per-row scales and per-64 sums of the FP8 values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/ops.h"

namespace nibble::cuda {

struct QuantizeRowsArgs {
  const void* x;     // BF16 (rows, cols)
  uint8_t* codes;    // FP8 (rows, cols)
  float* scale;      // (rows)
  float* sums;       // (rows, cols / 64); nullptr: not written (then cols % 16 == 0 suffices)
  int64_t rows;
  int64_t cols;
  float static_scale = 0.0f;  // > 0: this per-tensor scale (values beyond ±448·scale saturate)
  // Optional gather (the prefill path): row r reads x row src_row[r]; -1 writes a row of zero codes
  // (scale 0, sums 0). nullptr: row r reads x row r.
  const int32_t* src_row = nullptr;  // (rows)
  // Optional copies in the routed order (the grouped GEMM reads its activation tiles from them): row
  // r's codes also go to rows row_pos[r·top_k + j], j < top_k, of sorted_codes. nullptr: none.
  uint8_t* sorted_codes = nullptr;   // FP8 (rows · top_k, cols)
  const int32_t* row_pos = nullptr;  // (rows · top_k)
  int64_t top_k = 0;
  // Tensor parallelism (a row-parallel linear: each rank holds a slice of every row): amax_out set,
  // the kernel only writes each row's amax; amax_in set, row r's scale is max(amax_in[r], 1e-12) / 448
  // (the dynamic formula, once the amax is reduced over the ranks).
  float* amax_out = nullptr;       // (rows)
  const float* amax_in = nullptr;  // (rows)
};

void quantize_rows_fp8(const QuantizeRowsArgs& args, cudaStream_t stream);

// The activation kernel: a cluster of blocks a row staging it in shared memory, or one block a row
// holding it in registers (I up to 16384); kAuto: NIBBLE_ACTIVATION, else the cluster kernel for rows
// whose clusters fit one block an SM and the row kernel for more (where it takes the row).
enum class ActivationKernel : uint8_t { kAuto, kCluster, kRows };

struct ActivationArgs {
  const float* gate_up;  // (splits, max_rows, 2I): partial sums over K splits, added here
  // The columns of each row (and of channel_scale): gate and up interleaved by kGluRows
  // (moe_gemm_w4a8.h), as the MoE layer's weights are uploaded; false: gate [0, I), up [I, 2I).
  bool interleaved = false;
  int64_t splits;
  int64_t max_rows;
  uint8_t* codes;        // FP8 (rows, I)
  float* scale;          // (rows)
  float* sums;           // (rows, I / 64)
  int64_t rows;
  int64_t intermediate;  // I
  Activation activation;
  // Optional scaling of an unscaled product (the prefill path's cuBLASLt output): gate_up[r][n] is
  // multiplied by row_scale[r] · channel_scale[row_expert[r]][n] before the activation; rows with
  // row_expert -1 (padding) get zero codes. nullptr: gate_up is already scaled.
  const float* row_scale = nullptr;      // (rows)
  const float* channel_scale = nullptr;  // (E, 2I)
  const int32_t* row_expert = nullptr;   // (rows)
  // Tensor parallelism (each rank holds a slice of I): amax_out set, the kernel only writes each row's
  // amax of its slice; amax_in set, the row's scale is max(amax_in[r], 1e-12) / 448 (the dynamic
  // formula over the whole row once the amax is reduced over ranks).
  float* amax_out = nullptr;      // (rows)
  const float* amax_in = nullptr;  // (rows)
  ActivationKernel kernel = ActivationKernel::kAuto;
  // The kernels' one-split variants (no loop over K splits, the activation a template argument; the
  // same values bit for bit) where splits == 1: 1 yes, 0 no, -1 NIBBLE_ACTIVATION_ONE_SPLIT (yes
  // unless it is 0).
  int one_split = -1;
  // One split only: the product in BF16 (max_rows, 2I), read instead of gate_up (the prefill path's
  // PrefillOptions::gate_up_product); the one-split variants take it. nullptr: gate_up.
  const void* gate_up_bf16 = nullptr;
  // gate_up holds act(gate) · up already (max_rows, I), F32, scaled (the gate_up GEMM's fused
  // activation, GemmW4A8Args::glu): the kernels only quantize it, as they would have their own values.
  bool activated = false;
  // Each row's amax in amax_parts parts (rows, amax_parts), F32 (GemmW4A8Args::glu_amax): the cluster
  // kernel takes the row's from them rather than from an exchange between its blocks (the same max);
  // the row kernel, which has the row in one block, ignores them. nullptr: none.
  const float* part_amax = nullptr;
  int64_t amax_parts = 0;
};

void activation_quantize_fp8(const ActivationArgs& args, cudaStream_t stream);
// Whether activation_quantize_fp8(args) takes the cluster kernel (the one that reads part_amax).
bool activation_takes_cluster_kernel(const ActivationArgs& args);
// The same, with `communicator` (nullptr: a single GPU): unless tp_local_amax(), every rank's rows
// quantized with the amax over all ranks, as one GPU holding the whole row would. amax: F32 scratch of
// at least `rows`.
void activation_quantize_fp8(const ActivationArgs& args, Communicator* communicator, Tensor& amax,
                             cudaStream_t stream);

// Under tensor parallelism, whether each rank quantizes its slice of a row (the o_proj and down_proj
// inputs) with the slice's own amax, as vLLM and SGLang do, rather than with the row's over all ranks
// (an all_reduce_max and a second pass a quantization, as one GPU would round). Each rank's scale is
// applied before the sum, so the result is as accurate, only no longer tp 1's rounding: measured on the
// tiny fixtures against the unquantized model (CudaTensorParallel.QuantizedTp2AsAccurateAsOneGpu,
// bench/RESULTS.md, fourteenth session) tp 2 lands within 2% of tp 1's own error either way, while
// Mixtral-8x7B tp 2 decodes batch 32 in 6.51 ms a step against 7.01. On by default;
// NIBBLE_TP_LOCAL_AMAX=0 (read once) or set_tp_local_amax(false) takes the row's amax over the ranks.
bool tp_local_amax();
void set_tp_local_amax(bool local);

}  // namespace nibble::cuda
