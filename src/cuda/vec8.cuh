// Eight consecutive elements a thread: 16 bytes of BF16 or 32 of F32 moved at once, as fp32 values
// (the small kernels of basic_ops.cu and attention.cu).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace nibble::cuda {

inline constexpr int kVec = 8;  // elements a thread moves at once: 16 bytes of BF16, 32 of F32

// 8 consecutive elements as fp32, from 16-byte-aligned F32 or BF16 memory.
__device__ inline void load8(const float* p, float (&v)[kVec]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// 8 BF16 values held in a uint4, as fp32.
__device__ inline void unpack8(uint4 u, float (&v)[kVec]) {
  const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < kVec / 2; ++j) {  // a BF16 is the upper half of its fp32 value
    v[2 * j] = __uint_as_float(words[j] << 16);
    v[2 * j + 1] = __uint_as_float(words[j] & 0xFFFF0000u);
  }
}

__device__ inline void load8(const __nv_bfloat16* p, float (&v)[kVec]) {
  unpack8(*reinterpret_cast<const uint4*>(p), v);
}

// Stores 8 fp32 values as F32, or as BF16 rounded to nearest even.
__device__ inline void store8(float* p, const float (&v)[kVec]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ inline void store8(__nv_bfloat16* p, const float (&v)[kVec]) {
  uint4 u;
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int j = 0; j < kVec / 2; ++j) pairs[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

}  // namespace nibble::cuda
