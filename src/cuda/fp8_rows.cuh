// Block-level per-row FP8 quantization shared by the kernels that produce GEMM inputs: given a row's
// fp32 values in shared memory, writes its FP8 codes, its scale max(amax, 1e-12) / 448 and the sums of
// the FP8 values per 64-wide block (the grouped GEMM's offset correction). A static scale, when given,
// replaces the dynamic one. Same rounding as the CPU
// twin (quant/fp8_quant.h): x / scale rounded to nearest even, saturating.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/vec8.cuh"

#include <cstdint>

namespace nibble::cuda {

inline constexpr int kRowBlock = 64;  // must equal kGemmKBlock

// All threads of the block call this; `values` holds `cols` floats (cols % 64 == 0, or cols % 16 == 0
// when `sums` is nullptr: no block sums).
__device__ inline void quantize_row_fp8(const float* values, int64_t cols, uint8_t* codes, float* scale_out,
                                        float* sums, float* reduce /* smem, 32 floats */,
                                        float static_scale = 0.0f) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) amax = fmaxf(amax, fabsf(values[i]));
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if (lane == 0) reduce[warp] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = 0.0f;
    for (int w = 0; w < warps; ++w) m = fmaxf(m, reduce[w]);
    reduce[0] = static_scale > 0.0f ? static_scale : fmaxf(m, 1e-12f) / 448.0f;
  }
  __syncthreads();
  const float scale = reduce[0];
  if (sums == nullptr) {  // no block sums wanted: any multiple of 16 columns
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
      codes[i] = __nv_cvt_float_to_fp8(values[i] / scale, __NV_SATFINITE, __NV_E4M3);
  }
  // Each warp quantizes whole 64-wide blocks, two values a lane, and sums them.
  for (int64_t blk = warp; sums != nullptr && blk < cols / kRowBlock; blk += warps) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t i = blk * kRowBlock + j * 32 + lane;
      const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(values[i] / scale, __NV_SATFINITE, __NV_E4M3);
      codes[i] = q;
      sum += __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
    }
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
    if (lane == 0) sums[blk] = sum;
  }
  if (threadIdx.x == 0) *scale_out = scale;
  __syncthreads();  // `reduce` and `values` may be reused by the caller
}

// The block's amax of every thread's `amax` (a multiple of 32 threads; warp_amax: a float a warp).
__device__ inline float block_amax(float amax, float* warp_amax) {
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  for (unsigned w = 0; w < blockDim.x / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
  return amax;
}

// Where a row's codes are also stored: rows rows[j], j < count, of `codes` (`cols` bytes a row).
struct CodeCopies {
  uint8_t* codes = nullptr;
  const int32_t* rows = nullptr;
  int64_t count = 0, cols = 0;
};

// A row held in registers as units of 8 columns (thread i: units i, i + blockDim, ...) quantized with
// `scale`: its FP8 codes (8 bytes a unit; also to `copies`) and, when `sums` is given, the sums of
// each 64-wide block's FP8 values (8 consecutive units: 8 consecutive lanes; exact in fp32 whatever
// the order).
template <int kUnits>
__device__ inline void store_units_fp8(const float (&v)[kUnits][8], int64_t units, float scale, uint8_t* codes,
                                       float* sums, const CodeCopies& copies = {}) {
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = u * int64_t{blockDim.x} + threadIdx.x;
    float sum = 0.0f;
    if (unit < units) {
      uint32_t packed[2] = {0u, 0u};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v[u][j] / scale, __NV_SATFINITE, __NV_E4M3);
        packed[j / 4] |= uint32_t{q} << (8 * (j % 4));
        sum += __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
      }
      *reinterpret_cast<uint2*>(codes + unit * 8) = make_uint2(packed[0], packed[1]);
      for (int64_t j = 0; j < copies.count; ++j)
        *reinterpret_cast<uint2*>(copies.codes + copies.rows[j] * copies.cols + unit * 8) =
            make_uint2(packed[0], packed[1]);
    }
    if (sums != nullptr) {  // every lane shuffles; units come in whole 64-blocks (cols % 64 == 0)
      for (int o = 4; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
      if (unit < units && unit % 8 == 0) sums[unit / 8] = sum;
    }
  }
}

// Row `src` of BF16 x (cols % 64 == 0) quantized by one block (its threads a multiple of 32) into
// codes, *scale_out (max(amax, 1e-12) / 448) and the 64-block sums, the values of quantize_rows_kernel
// (moe_quantize.cu) bit for bit: the row is read twice, for its amax and then for the codes (the
// second read hits L1), rather than held in registers, so any row length takes one loop.
__device__ inline void quantize_bf16_row_fp8(const void* x, int64_t src, int64_t cols, uint8_t* codes,
                                             float* scale_out, float* sums, float* warp_amax) {
  const auto* row = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(x) + src * cols);
  const int64_t units = cols / 8, steps = (units + blockDim.x - 1) / blockDim.x;
  float amax = 0.0f;
  for (int64_t unit = threadIdx.x; unit < units; unit += blockDim.x) {
    float v[1][8];
    unpack8(row[unit], v[0]);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[0][j]));
  }
  const float scale = fmaxf(block_amax(amax, warp_amax), 1e-12f) / 448.0f;
  for (int64_t step = 0; step < steps; ++step) {  // every thread takes every step (the sums shuffle)
    const int64_t unit = step * blockDim.x + threadIdx.x;
    float v[1][8] = {};
    if (unit < units) unpack8(row[unit], v[0]);
    store_units_fp8<1>(v, units - step * blockDim.x, scale, codes + step * blockDim.x * 8,
                       sums != nullptr ? sums + step * blockDim.x / 8 : nullptr);
  }
  if (threadIdx.x == 0) *scale_out = scale;
}

}  // namespace nibble::cuda
