// The rotation of Neox RoPE: shared by rope_kernel (basic_ops.cu), the fused RoPE + KV append
// (attention.cu) and the decode kernel's own (attention_decode.cu), so all compute the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/vec8.cuh"

namespace nibble::cuda {

// The sine and cosine of position · freq, the product rounded before sincosf sees it (never fused into
// its range reduction), so every kernel gets the same angle.
__device__ inline void rope_sincos(float position, float freq, float& s, float& c) {
  sincosf(__fmul_rn(position, freq), &s, &c);
}

// The pair (a, b) rotated by the angle of sine s and cosine c: (a c − b s, b c + a s), the products
// rounded before the sum (no fused multiply-add), as the CPU twin computes them, and each result
// rounded once to BF16 (returned as fp32).
__device__ inline float rope_first(float a, float b, float s, float c) {
  return __bfloat162float(__float2bfloat16_rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s))));
}
__device__ inline float rope_second(float a, float b, float s, float c) {
  return __bfloat162float(__float2bfloat16_rn(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s))));
}

// Rotates the pairs (x[j], x[half + j]), j < 8, of a BF16 head at `position` by the angles
// position · freq[j], in place. x1 and x2 return the stored values.
__device__ inline void rope_rotate8(__nv_bfloat16* x, int64_t half, const float* freq, float position,
                                    float (&x1)[kVec], float (&x2)[kVec]) {
  float f[kVec];
  load8(x, x1);
  load8(x + half, x2);
  load8(freq, f);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float s, c;
    rope_sincos(position, f[j], s, c);
    const float a = x1[j], b = x2[j];
    x1[j] = rope_first(a, b, s, c);
    x2[j] = rope_second(a, b, s, c);
  }
  store8(x, x1);
  store8(x + half, x2);
}

}  // namespace nibble::cuda
