// How a key or value element enters the KV cache: BF16 as it is, or the FP8 e4m3 code of value / scale
// (saturated). Shared by the KV append kernels (attention.cu) and the decode kernel's own append
// (attention_decode.cu), so both store the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/vec8.cuh"

namespace nibble::cuda {

__device__ inline void store_kv(void* cache, bool fp8, float scale, int64_t index, float v) {
  if (fp8)
    static_cast<__nv_fp8_storage_t*>(cache)[index] = __nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3);
  else
    static_cast<__nv_bfloat16*>(cache)[index] = __float2bfloat16_rn(v);
}

// 8 elements (BF16 values) into the cache at `index`, in one store.
__device__ inline void store8_kv(void* cache, bool fp8, float scale, int64_t index, const float (&v)[kVec]) {
  if (!fp8) return store8(static_cast<__nv_bfloat16*>(cache) + index, v);
  uint2 u;
  auto* bytes = reinterpret_cast<__nv_fp8_storage_t*>(&u);
#pragma unroll
  for (int j = 0; j < kVec; ++j) bytes[j] = __nv_cvt_float_to_fp8(v[j] / scale, __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint2*>(static_cast<__nv_fp8_storage_t*>(cache) + index) = u;
}

}  // namespace nibble::cuda
