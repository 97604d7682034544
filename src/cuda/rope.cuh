// The rotation of Neox RoPE, 8 pairs a thread: shared by rope_kernel (basic_ops.cu) and the fused
// RoPE + KV append (attention.cu), so both compute the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/vec8.cuh"

namespace nibble::cuda {

// Rotates the pairs (x[j], x[half + j]), j < 8, of a BF16 head at `position` by the angles
// position · freq[j], in place: the products rounded before the sum (no fused multiply-add), as the
// CPU twin computes them, and each result rounded once to BF16. x1 and x2 return the stored values.
__device__ inline void rope_rotate8(__nv_bfloat16* x, int64_t half, const float* freq, float position,
                                    float (&x1)[kVec], float (&x2)[kVec]) {
  float f[kVec];
  load8(x, x1);
  load8(x + half, x2);
  load8(freq, f);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float s, c;
    sincosf(position * f[j], &s, &c);
    const float a = x1[j], b = x2[j];
    x1[j] = __bfloat162float(__float2bfloat16_rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s))));
    x2[j] = __bfloat162float(__float2bfloat16_rn(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s))));
  }
  store8(x, x1);
  store8(x + half, x2);
}

}  // namespace nibble::cuda
