// What RMSNorm's row kernels share (basic_ops.cu, moe_combine.cu), so that each computes a row's
// norm in the same order and gets the same bits: one block a row, thread i holding the 8-element
// units i, i + blockDim, ... (up to 8) in registers, Σx² over a warp-shuffle tree and then the warps
// in order.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>

#include "core/error.h"
#include "cuda/vec8.cuh"

namespace nibble::cuda {

// The block's threads and the units a thread holds for a row of `hidden` elements: 256 threads (fewer
// for a small row) holding up to 8 units each, 512 threads above 16384 elements.
struct RowNormShape {
  int threads;
  int units_per_thread;  // 1, 2, 4 or 8: the kernels' kUnits
};

inline RowNormShape row_norm_shape(int64_t hidden) {
  const int64_t units = hidden / kVec;
  int threads = static_cast<int>(std::min<int64_t>(256, (units + 31) / 32 * 32));
  if (units > int64_t{256} * 8) threads = 512;
  const int64_t per_thread = (units + threads - 1) / threads;
  check(per_thread <= 8, "rms_norm: hidden size ", hidden, " is larger than ", 512 * 8 * kVec);
  return {threads, per_thread <= 1 ? 1 : per_thread <= 2 ? 2 : per_thread <= 4 ? 4 : 8};
}

// Σ over the block of each thread's `sum`, the same value in every thread. warp_sums (32 floats of
// shared memory) is free again on return.
__device__ inline float block_sum(float sum, float* warp_sums) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.0f;  // every thread adds the warps' sums in the same order
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_sums[w];
  __syncthreads();  // every thread has read warp_sums
  return total;
}

// sum + Σ v[j]², in order.
__device__ inline float add_squares(float sum, const float (&v)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) sum = __fmaf_rn(v[j], v[j], sum);
  return sum;
}

// v · inv · w rounded to BF16, as an fp32 value: a post-norm's output as rms_norm stores it and the
// residual add reads it back.
__device__ inline void scale_unit_bf16(float (&v)[kVec], float inv, uint4 w_raw) {
  float w[kVec];
  unpack8(w_raw, w);
#pragma unroll
  for (int j = 0; j < kVec; ++j) v[j] = __bfloat162float(__float2bfloat16_rn(v[j] * inv * w[j]));
}

// 1 / rms of a row from its Σx², as the CPU computes it.
__device__ inline float inverse_rms(float sum_squares, int64_t hidden, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(hidden) + eps);
}

// Units 8·unit .. + 7 of a row scaled by inv and the weights, v · inv · w in that order.
__device__ inline void scale_unit(const float (&v)[kVec], float inv, uint4 w_raw, float (&out)[kVec]) {
  float w[kVec];
  unpack8(w_raw, w);
#pragma unroll
  for (int j = 0; j < kVec; ++j) out[j] = v[j] * inv * w[j];
}

}  // namespace nibble::cuda
