// Repacked INT4 / FP8 expert weights -> plain FP8 e4m3 (N, K) row-major (moe_dequant.h). One thread
// per lane of a (16-row tile, 64-wide K block): it reads the lane's 16 (INT4) or 32 (FP8) bytes
// with wide loads and writes 4-byte pieces of the rows they hold.
#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/moe_dequant.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

// e4m3 bytes of v = u - 8 for a stored nibble u in [0, 15]: u 0..7 -> -8..-1, u 8..15 -> 0..7.
constexpr uint64_t kNegative = 0xB8C0C4C8CACCCED0ull;  // byte u: e4m3(u - 8) for u < 8
constexpr uint64_t kPositive = 0x4E4C4A4844403800ull;  // byte u - 8: e4m3(u - 8) for u >= 8

__device__ inline uint32_t e4m3_of_nibble(uint32_t u) {
  const uint64_t table = u < 8 ? kNegative : kPositive;
  return static_cast<uint32_t>(table >> (8 * (u & 7))) & 0xFFu;
}

// Lane (g = lane / 4, q = lane % 4) of tile t, K block kb: word j (s = j >> 1, h = j & 1) holds in
// byte b the nibbles of rows 16t + g (low) and 16t + g + 8 (high), column 64kb + 32s + 16h + 4q +
// b.
__global__ void dequant_int4_kernel(const __grid_constant__ DequantArgs a) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t lanes_per_expert = a.n * a.k / 32;  // 32 values (16 bytes) a lane
  const int64_t total = a.count * lanes_per_expert, kblocks = a.k / kGemmKBlock;
  const auto* src = static_cast<const uint4*>(a.weights) + a.first * lanes_per_expert;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = src[i];
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    const int64_t e = i / lanes_per_expert, r = i % lanes_per_expert;
    const int lane = static_cast<int>(r % 32), g = lane >> 2, q = lane & 3;
    const int64_t kb = (r / 32) % kblocks, t = r / 32 / kblocks;
    uint8_t* row_lo = a.out + (e * a.n + 16 * t + g) * a.k + kb * kGemmKBlock + 4 * q;
    uint8_t* row_hi = row_lo + 8 * a.k;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        lo |= e4m3_of_nibble((words[j] >> (8 * b)) & 0xFu) << (8 * b);
        hi |= e4m3_of_nibble((words[j] >> (8 * b + 4)) & 0xFu) << (8 * b);
      }
      const int64_t col = 32 * (j >> 1) + 16 * (j & 1);
      *reinterpret_cast<uint32_t*>(row_lo + col) = lo;
      *reinterpret_cast<uint32_t*>(row_hi + col) = hi;
    }
  }
}

// FP8 layout: lane (g, q), word 4s + rr holds row 16t + g + 8(rr & 1), columns
// 64kb + 32s + 16(rr >> 1) + 4q .. + 3, as stored.
__global__ void dequant_fp8_kernel(const __grid_constant__ DequantArgs a) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t lanes_per_expert = a.n * a.k / 32;  // 32 values (32 bytes) a lane
  const int64_t total = a.count * lanes_per_expert, kblocks = a.k / kGemmKBlock;
  const auto* src = static_cast<const uint4*>(a.weights) + 2 * a.first * lanes_per_expert;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v0 = src[2 * i], v1 = src[2 * i + 1];
    const uint32_t words[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    const int64_t e = i / lanes_per_expert, r = i % lanes_per_expert;
    const int lane = static_cast<int>(r % 32), g = lane >> 2, q = lane & 3;
    const int64_t kb = (r / 32) % kblocks, t = r / 32 / kblocks;
    uint8_t* base = a.out + (e * a.n + 16 * t + g) * a.k + kb * kGemmKBlock + 4 * q;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const int s = w >> 2, rr = w & 3;
      *reinterpret_cast<uint32_t*>(base + 8 * (rr & 1) * a.k + 32 * s + 16 * (rr >> 1)) = words[w];
    }
  }
}

}  // namespace

void dequantize_experts_fp8(const DequantArgs& a, cudaStream_t stream) {
  check(a.n % 16 == 0 && a.k % kGemmKBlock == 0, "dequantize_experts_fp8: sizes ", a.n, "x", a.k,
        " are not multiples of 16 and ", kGemmKBlock);
  if (a.count == 0) return;
  const int64_t lanes = a.count * a.n * a.k / 32;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((lanes + 255) / 256, 132 * 16));
  if (a.format == ExpertWeightFormat::kInt4)
    launch_kernel(dequant_int4_kernel, blocks, 256, 0, stream, a);
  else
    launch_kernel(dequant_fp8_kernel, blocks, 256, 0, stream, a);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
