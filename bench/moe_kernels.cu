// Baseline MoE elementwise kernels: one block per row, 8 elements (16 bytes of BF16) per access.
// Plain and memory-bound; the per-row FP8 quantizers read their row twice (amax, then quantize).
#include "moe_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace nibble::bench {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;
constexpr float kFp8Max = 448.0f;
constexpr float kMinAmax = 1e-12f;

struct Vec8 {
  float v[kVec];
};

__device__ Vec8 load_bf16x8(const __nv_bfloat16* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  Vec8 out;
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out.v[2 * i] = f.x;
    out.v[2 * i + 1] = f.y;
  }
  return out;
}

__device__ void store_bf16x8(__nv_bfloat16* p, const Vec8& in) {
  uint4 raw;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) h[i] = __floats2bfloat162_rn(in.v[2 * i], in.v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__device__ void store_fp8x8(uint8_t* p, const Vec8& in, float inv_scale) {
  uint2 raw;
  auto* h = reinterpret_cast<__nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i)
    h[i] =
        __nv_cvt_float2_to_fp8x2(make_float2(in.v[2 * i] * inv_scale, in.v[2 * i + 1] * inv_scale),
                                 __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint2*>(p) = raw;
}

__device__ float block_max(float v) {
  __shared__ float warp_max[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1)
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (threadIdx.x == 0) warp_max[0] = v;
  }
  __syncthreads();
  return warp_max[0];
}

__device__ float silu(float g) {
  return g / (1.0f + __expf(-g));
}

__device__ Vec8 silu_mul_at(const __nv_bfloat16* row, int64_t inter, int64_t col, float scale) {
  const Vec8 gate = load_bf16x8(row + col);
  const Vec8 up = load_bf16x8(row + inter + col);
  Vec8 out;
#pragma unroll
  for (int i = 0; i < kVec; ++i) out.v[i] = silu(gate.v[i] * scale) * (up.v[i] * scale);
  return out;
}

__global__ void gather_rows_kernel(const uint4* x, const int32_t* sorted_pairs, int top_k,
                                   int64_t vecs, uint4* out) {
  const int64_t r = blockIdx.x;
  const int64_t t = sorted_pairs[r] / top_k;
  for (int64_t i = threadIdx.x; i < vecs; i += kThreads) out[r * vecs + i] = x[t * vecs + i];
}

__global__ void gather_quantize_fp8_kernel(const __nv_bfloat16* x, const int32_t* sorted_pairs,
                                           int top_k, int64_t hidden, uint8_t* out, float* scale) {
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* row = x + (sorted_pairs[r] / top_k) * hidden;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x * kVec; c < hidden; c += kThreads * kVec) {
    const Vec8 v = load_bf16x8(row + c);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(v.v[i]));
  }
  const float s = fmaxf(block_max(amax), kMinAmax) / kFp8Max;
  if (threadIdx.x == 0) scale[r] = s;
  for (int64_t c = threadIdx.x * kVec; c < hidden; c += kThreads * kVec)
    store_fp8x8(out + r * hidden + c, load_bf16x8(row + c), 1.0f / s);
}

__global__ void silu_mul_kernel(const __nv_bfloat16* gate_up, int64_t inter, __nv_bfloat16* act) {
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* row = gate_up + r * 2 * inter;
  for (int64_t c = threadIdx.x * kVec; c < inter; c += kThreads * kVec)
    store_bf16x8(act + r * inter + c, silu_mul_at(row, inter, c, 1.0f));
}

__global__ void silu_mul_quantize_fp8_kernel(const __nv_bfloat16* gate_up, const float* row_scale,
                                             int64_t inter, uint8_t* act, float* act_scale) {
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* row = gate_up + r * 2 * inter;
  const float in_scale = row_scale[r];
  float amax = 0.0f;
  for (int64_t c = threadIdx.x * kVec; c < inter; c += kThreads * kVec) {
    const Vec8 v = silu_mul_at(row, inter, c, in_scale);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(v.v[i]));
  }
  const float s = fmaxf(block_max(amax), kMinAmax) / kFp8Max;
  if (threadIdx.x == 0) act_scale[r] = s;
  for (int64_t c = threadIdx.x * kVec; c < inter; c += kThreads * kVec)
    store_fp8x8(act + r * inter + c, silu_mul_at(row, inter, c, in_scale), 1.0f / s);
}

__global__ void combine_kernel(const __nv_bfloat16* down, const int32_t* pair_rows,
                               const float* topk_weights, const float* row_scale, int top_k,
                               int64_t hidden, __nv_bfloat16* out) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x * kVec; c < hidden; c += kThreads * kVec) {
    Vec8 acc{};
    for (int k = 0; k < top_k; ++k) {
      const int64_t r = pair_rows[t * top_k + k];
      const float w = topk_weights[t * top_k + k] * (row_scale != nullptr ? row_scale[r] : 1.0f);
      const Vec8 v = load_bf16x8(down + r * hidden + c);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc.v[i] += w * v.v[i];
    }
    store_bf16x8(out + t * hidden + c, acc);
  }
}

template <ElementType kType>
__global__ void convert_to_f32_kernel(const void* in, int64_t n, float scale, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float v;
    if constexpr (kType == ElementType::kBf16) {
      v = __bfloat162float(static_cast<const __nv_bfloat16*>(in)[i]);
    } else {
      const __half_raw h =
          __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(in)[i], __NV_E4M3);
      v = __half2float(__half(h));
    }
    out[i] = v * scale;
  }
}

void check_width(int64_t width, const char* what) {
  check(width > 0 && width % kVec == 0, "moe kernels: ", what, " ", width,
        " must be a positive multiple of ", kVec);
}

unsigned grid(int64_t rows) {
  return static_cast<unsigned>(rows);
}

}  // namespace

void gather_rows(const void* x, const int32_t* sorted_pairs, int64_t top_k, int64_t num_rows,
                 int64_t hidden, void* out, cudaStream_t stream) {
  check_width(hidden, "hidden size");
  if (num_rows == 0) return;
  gather_rows_kernel<<<grid(num_rows), kThreads, 0, stream>>>(
      static_cast<const uint4*>(x), sorted_pairs, static_cast<int>(top_k), hidden / kVec,
      static_cast<uint4*>(out));
  cuda_check(cudaGetLastError());
}

void gather_quantize_fp8(const void* x, const int32_t* sorted_pairs, int64_t top_k,
                         int64_t num_rows, int64_t hidden, void* out, float* scale,
                         cudaStream_t stream) {
  check_width(hidden, "hidden size");
  if (num_rows == 0) return;
  gather_quantize_fp8_kernel<<<grid(num_rows), kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), sorted_pairs, static_cast<int>(top_k), hidden,
      static_cast<uint8_t*>(out), scale);
  cuda_check(cudaGetLastError());
}

void silu_mul(const void* gate_up, int64_t num_rows, int64_t inter, void* act,
              cudaStream_t stream) {
  check_width(inter, "intermediate size");
  if (num_rows == 0) return;
  silu_mul_kernel<<<grid(num_rows), kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(gate_up), inter, static_cast<__nv_bfloat16*>(act));
  cuda_check(cudaGetLastError());
}

void silu_mul_quantize_fp8(const void* gate_up, const float* row_scale, int64_t num_rows,
                           int64_t inter, void* act, float* act_scale, cudaStream_t stream) {
  check_width(inter, "intermediate size");
  if (num_rows == 0) return;
  silu_mul_quantize_fp8_kernel<<<grid(num_rows), kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(gate_up), row_scale, inter, static_cast<uint8_t*>(act),
      act_scale);
  cuda_check(cudaGetLastError());
}

void combine(const void* down, const int32_t* pair_rows, const float* topk_weights,
             const float* row_scale, int64_t num_tokens, int64_t top_k, int64_t hidden, void* out,
             cudaStream_t stream) {
  check_width(hidden, "hidden size");
  if (num_tokens == 0) return;
  combine_kernel<<<grid(num_tokens), kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(down), pair_rows, topk_weights, row_scale,
      static_cast<int>(top_k), hidden, static_cast<__nv_bfloat16*>(out));
  cuda_check(cudaGetLastError());
}

void convert_to_f32(const void* in, ElementType type, int64_t n, float scale, float* out,
                    cudaStream_t stream) {
  if (n == 0) return;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 32));
  switch (type) {
    case ElementType::kBf16:
      convert_to_f32_kernel<ElementType::kBf16><<<blocks, kThreads, 0, stream>>>(in, n, scale, out);
      break;
    case ElementType::kFp8E4M3:
      convert_to_f32_kernel<ElementType::kFp8E4M3>
          <<<blocks, kThreads, 0, stream>>>(in, n, scale, out);
      break;
  }
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::bench
