// The tensor-core helpers the attention kernels share (attention_decode.cu, attention_prefill.cu):
// m16n8k16 MMAs in f16 over an FP8 KV cache (its values widened exactly) or bf16 over a BF16 one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/ptx.cuh"

namespace nibble::cuda::attention_mma {

// Two FP8 e4m3 values (the low 16 bits) as f16x2, exactly.
__device__ inline uint32_t fp8x2_to_f16x2(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3);
  return uint32_t{h.x} | (uint32_t{h.y} << 16);
}

// Two floats as the MMA's 16-bit pair: f16 against an FP8 cache, bf16 against a BF16 one.
template <bool kFp8>
__device__ inline uint32_t pack2(float lo, float hi) {
  if constexpr (kFp8) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// d (16×8 f32) += a (16×16) · b (16×8), f16 or bf16 fragments.
template <bool kFp8>
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kFp8)
    ptx::mma_f16_16x8x16(d, a, b);
  else
    ptx::mma_bf16_16x8x16(d, a, b);
}

template <bool kFp8>
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const uint32_t b[2] = {b0, b1};
  mma<kFp8>(d, a, b);
}

}  // namespace nibble::cuda::attention_mma
