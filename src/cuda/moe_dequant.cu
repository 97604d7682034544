// Repacked INT4 / FP8 expert weights -> plain FP8 e4m3 (N, K) row-major (moe_dequant.h). One warp
// per (expert, 16-row tile, 64-wide K block) of the layout: each lane reads its 16 (INT4) or 32 (FP8)
// bytes with wide loads, turns them into the FP8 words of the rows they hold and puts them in the
// warp's 16 × 64-byte piece of shared memory; the warp then writes the piece out as 16-byte stores,
// eight rows' 64 bytes a store instruction (whole 32-byte sectors). The earlier kernel stored each
// lane's 4-byte words straight to global memory, half a sector a row a store, with 64-bit index
// arithmetic a lane. Measured on an H200 (bench/RESULTS.md, twenty-second session, nibble-bench-moe,
// the MoE layer on the prefill path, one call): Mixtral 4096 tokens 4574 -> 3730 µs, 32768 tokens
// 25030 -> 24402; Grok-1 as one rank of tp 2, 4096 tokens 7297 -> 5917, 32768 40140 -> 39606.
#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/moe_dequant.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kWarps = 8;  // warps a block

// e4m3 bytes of v = u - 8 for stored nibbles u in [0, 15], four at a time (bytes of `u`, each < 16):
// u < 8 -> -8..-1 from kNegative[u], u >= 8 -> 0..7 from kPositive[u - 8], the tables read by byte
// permutes on u & 7 (__byte_perm reads a selector's low 3 bits only) and blended by each byte's bit 3.
constexpr uint32_t kNegativeLo = 0xCACCCED0u, kNegativeHi = 0xB8C0C4C8u;  // e4m3(-8) .. e4m3(-1)
constexpr uint32_t kPositiveLo = 0x44403800u, kPositiveHi = 0x4E4C4A48u;  // e4m3(0) .. e4m3(7)

__device__ inline uint32_t e4m3_of_nibbles(uint32_t u) {
  const uint32_t packed = u | (u >> 4);                                  // nibbles u0 u1 in byte 0, u2 u3 in byte 2
  const uint32_t select = __byte_perm(packed, 0u, 0x0020u) & 0x7777u;   // the four u & 7, as selectors
  const uint32_t negative = __byte_perm(kNegativeLo, kNegativeHi, select);
  const uint32_t positive = __byte_perm(kPositiveLo, kPositiveHi, select);
  const uint32_t high = ((u >> 3) & 0x01010101u) * 0xFFu;  // each byte: 0xFF where u >= 8
  return (negative & ~high) | (positive & high);
}

// The warp's piece: 16 rows × 64 bytes, 16-byte chunk c of row r at chunk c ^ ((r >> 1) & 3) of the
// row (the lanes' 4-byte writes of one (s, h) and the 16-byte reads of eight rows both meet every
// bank once).
struct Piece {
  uint32_t words[16 * 16];
  __device__ void put(int row, int chunk, int q, uint32_t v) {
    words[16 * row + 4 * (chunk ^ ((row >> 1) & 3)) + q] = v;
  }
  __device__ uint4 get(int row, int chunk) const {
    return *reinterpret_cast<const uint4*>(&words[16 * row + 4 * (chunk ^ ((row >> 1) & 3))]);
  }
};

// Lane (g = lane / 4, q = lane % 4) of item (expert, tile t, K block kb): word j of INT4 (s = j >> 1,
// h = j & 1) holds in byte b the nibbles of rows g (low) and g + 8 (high), column 32s + 16h + 4q + b;
// word 4s + rr of FP8 holds row g + 8(rr & 1), columns 32s + 16(rr >> 1) + 4q .. + 3.
template <ExpertWeightFormat kFormat>
__global__ void __launch_bounds__(32 * kWarps, 5) dequant_kernel(const __grid_constant__ DequantArgs a) {
  __shared__ Piece pieces[kWarps];
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  constexpr bool kInt4 = kFormat == ExpertWeightFormat::kInt4;
  constexpr int kLaneWords = kInt4 ? 1 : 2;  // uint4 a lane
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;
  Piece& piece = pieces[warp];
  const auto tiles = static_cast<uint32_t>(a.n / 16), kblocks = static_cast<uint32_t>(a.k / kGemmKBlock);
  const int64_t items = a.count * tiles * kblocks;
  const auto* src = static_cast<const uint4*>(a.weights) + (a.first * tiles * kblocks) * 32 * kLaneWords;
  // Two items a warp at a time, both loads issued before either is used (more bytes in flight; the
  // kernel tracer's mean launch at Mixtral 4096 tokens 173 µs against 179 with one, in two calls).
  const int64_t stride = int64_t{gridDim.x} * kWarps;
  for (int64_t first = blockIdx.x * int64_t{kWarps} + warp; first < items; first += 2 * stride) {
    uint4 v[2][kLaneWords];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int w = 0; w < kLaneWords; ++w)
        if (first + i * stride < items) v[i][w] = src[((first + i * stride) * 32 + lane) * kLaneWords + w];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t item = first + i * stride;
      if (item >= items) break;
      if constexpr (kInt4) {
        const uint32_t words[4] = {v[i][0].x, v[i][0].y, v[i][0].z, v[i][0].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          piece.put(g, j, q, e4m3_of_nibbles(words[j] & 0x0F0F0F0Fu));
          piece.put(g + 8, j, q, e4m3_of_nibbles((words[j] >> 4) & 0x0F0F0F0Fu));
        }
      } else {
        const uint32_t words[8] = {v[i][0].x, v[i][0].y, v[i][0].z, v[i][0].w,
                                   v[i][1].x, v[i][1].y, v[i][1].z, v[i][1].w};
#pragma unroll
        for (int w = 0; w < 8; ++w) {
          const int s = w >> 2, rr = w & 3;
          piece.put(g + 8 * (rr & 1), 2 * s + (rr >> 1), q, words[w]);
        }
      }
      __syncwarp();
      // Rows (e, 16t + r): lane L writes chunk L % 4 of row L / 4, then of row L / 4 + 8.
      const auto kb = static_cast<uint32_t>(item % kblocks);
      const int64_t tile_row = item / kblocks * 16;  // e · n + 16t: the tiles of consecutive experts follow
      uint8_t* base = a.out + tile_row * a.k + kb * kGemmKBlock + 16 * q;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = g + 8 * half;
        *reinterpret_cast<uint4*>(base + r * a.k) = piece.get(r, q);
      }
      __syncwarp();
    }
  }
}

}  // namespace

void dequantize_experts_fp8(const DequantArgs& a, cudaStream_t stream) {
  check(a.n % 16 == 0 && a.k % kGemmKBlock == 0, "dequantize_experts_fp8: sizes ", a.n, "x", a.k,
        " are not multiples of 16 and ", kGemmKBlock);
  if (a.count == 0) return;
  const int64_t items = a.count * (a.n / 16) * (a.k / kGemmKBlock);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((items + kWarps - 1) / kWarps, 132 * 16));
  if (a.format == ExpertWeightFormat::kInt4)
    launch_kernel(dequant_kernel<ExpertWeightFormat::kInt4>, blocks, 32 * kWarps, 0, stream, a);
  else
    launch_kernel(dequant_kernel<ExpertWeightFormat::kFp8>, blocks, 32 * kWarps, 0, stream, a);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
