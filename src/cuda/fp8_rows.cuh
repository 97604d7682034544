// Block-level per-row FP8 quantization shared by the kernels that produce GEMM inputs: given a row's
// fp32 values in shared memory, writes its FP8 codes, its scale max(amax, 1e-12) / 448 and the sums of
// the FP8 values per 64-wide block (the grouped GEMM's offset correction). A static scale, when given,
// replaces the dynamic one. Same rounding as the CPU
// twin (quant/fp8_quant.h): x / scale rounded to nearest even, saturating.
#pragma once

#include <cuda_fp8.h>

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

}  // namespace nibble::cuda
