// The elementwise steps of the baseline MoE layers: gather routed rows, SiLU·mul, per-row FP8
// quantization, weighted combine (bench only; nibble's own layer has its own fused kernels).
// Rows are "sorted rows" (routing.h): r = position of pair sorted_pairs[r] in the expert grouping.
// All widths (H, I) must be multiples of 8 (16-byte accesses).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nibble::bench {

enum class ElementType { kBf16, kFp8E4M3 };

// out (R, H) BF16: out[r] = x[sorted_pairs[r] / top_k].  x (T, H) BF16.
void gather_rows(const void* x, const int32_t* sorted_pairs, int64_t top_k, int64_t num_rows,
                 int64_t hidden, void* out, cudaStream_t stream);

// Gather and quantize per row: out (R, H) F8_E4M3 = fp8(x[t] / scale[r]), scale (R) F32 =
// max(amax(x[t]), 1e-12) / 448, t = sorted_pairs[r] / top_k.
void gather_quantize_fp8(const void* x, const int32_t* sorted_pairs, int64_t top_k,
                         int64_t num_rows, int64_t hidden, void* out, float* scale,
                         cudaStream_t stream);

// act (R, I) BF16 = silu(gate) · up with gate_up (R, 2I) BF16, gate = columns [0, I), up = [I, 2I).
void silu_mul(const void* gate_up, int64_t num_rows, int64_t inter, void* act, cudaStream_t stream);

// The same, on gate_up × row_scale[r] (the per-row activation scale the FP8 GEMM left out), then
// quantized per row: act (R, I) F8_E4M3, act_scale (R) F32 as in gather_quantize_fp8.
void silu_mul_quantize_fp8(const void* gate_up, const float* row_scale, int64_t num_rows,
                           int64_t inter, void* act, float* act_scale, cudaStream_t stream);

// out (T, H) BF16: out[t] = Σ_k topk_weights[t, k] · row_scale[r] · down[r], r = pair_rows[t·K +
// k]; down (R, H) BF16; row_scale may be null (all ones).
void combine(const void* down, const int32_t* pair_rows, const float* topk_weights,
             const float* row_scale, int64_t num_tokens, int64_t top_k, int64_t hidden, void* out,
             cudaStream_t stream);

// out (n) F32 = in (n) × scale, for reading weights back to the host.
void convert_to_f32(const void* in, ElementType type, int64_t n, float scale, float* out,
                    cudaStream_t stream);

}  // namespace nibble::bench
