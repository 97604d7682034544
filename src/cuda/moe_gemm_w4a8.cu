// Grouped INT4 × FP8 (or FP8 × FP8) GEMM kernel (see moe_gemm_w4a8.h for the contract and the weight
// layouts).
// A block is one warpgroup owning 64 output channels of one expert and up to kTokenTiles × 8 of its
// rows at a time; it walks its K range through a 4-stage cp.async pipeline of 256-wide K steps (weights per lane,
// activations shared in wgmma's core-matrix layout) and multiplies with wgmma (A = weights from
// registers, B = activations from shared memory). Every 64-wide K block's result is added to fp32
// registers, so accumulation error does not grow with K.
#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/moe_gemm_w4a8.h"
#include "cuda/ptx.cuh"
#include "cuda/wgmma.cuh"

namespace nibble::cuda {
namespace {

constexpr int kWarps = 4;  // one warpgroup: 64 output channels
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 4;
constexpr int kBlocksPerStage = 4;  // 64-wide K blocks per pipeline stage (256 K, 8 KB of weights)
constexpr int kCoreBytes = 128;     // a wgmma core matrix: 8 rows × 16 bytes

// One stage: per K block, the warps' weight fragments, and the activations as K-major core matrices,
// core matrix (row group j, 16-byte K column c) at (j · 4 + c) · 128: 128 bytes between K neighbours,
// 512 between row groups.
template <int kTokenTiles, bool kFp8>
struct alignas(128) GemmSmem {
  uint4 weights[kStages][kBlocksPerStage][kWarps][kFp8 ? 64 : 32];  // 16 or 32 bytes a lane per K block
  uint8_t act[kStages][kBlocksPerStage][kTokenTiles * 8 * kGemmKBlock];
  int64_t act_row[kTokenTiles * 8];
  float token_sum[kTokenTiles * 8];
  float token_scale[kTokenTiles * 8];
};

template <int kTokenTiles, bool kFp8>
__global__ void __launch_bounds__(kThreads, 4) moe_gemm_w4a8_kernel(const __grid_constant__ GemmW4A8Args p) {
  constexpr int kRows = kTokenTiles * 8;
  constexpr int kAcc = kRows / 2;  // f32 accumulator registers per thread of an m64 × kRows tile
  constexpr int kLaneWords = kFp8 ? 2 : 1;  // uint4 a lane per K block
  extern __shared__ uint4 smem_raw[];
  auto& sm = *reinterpret_cast<GemmSmem<kTokenTiles, kFp8>*>(smem_raw);

  const int slot = blockIdx.y;
  if (slot >= p.active_experts[p.num_experts]) return;
  const int expert = p.active_experts[slot];
  const int row_begin = p.expert_offsets[expert];
  const int rows = p.expert_offsets[expert + 1] - row_begin;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;
  const int64_t tiles = p.n / 16, kblocks = p.k / kGemmKBlock;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kWarps + warp;  // this warp's 16 channels
  const bool tile_valid = tile < tiles;
  const int64_t per_split = (kblocks + p.splits - 1) / p.splits;
  const int64_t kb_begin = blockIdx.z * per_split;
  const int64_t kb_count = min(kblocks, kb_begin + per_split) - kb_begin;
  const int64_t stage_count = (kb_count + kBlocksPerStage - 1) / kBlocksPerStage;
  const uint4* weights =
      static_cast<const uint4*>(p.weights) + ((expert * tiles + tile) * kblocks * 32 + lane) * kLaneWords;

  for (int chunk = 0; chunk < rows; chunk += kRows) {
    // The activation row of each row of this chunk (-1 past the expert's last row).
    for (int rr = threadIdx.x; rr < kRows; rr += kThreads)
      sm.act_row[rr] = chunk + rr < rows ? (p.act_row ? p.act_row[row_begin + chunk + rr] : row_begin + chunk + rr)
                                         : -1;
    __syncthreads();

    auto load_stage = [&](int stage, int64_t first) {  // K blocks first .. first + 3 of the split
#pragma unroll 1
      for (int b = 0; b < kBlocksPerStage; ++b) {
        const int64_t kb = kb_begin + first + b;
        if (first + b >= kb_count) break;
        if (tile_valid)
#pragma unroll
          for (int w = 0; w < kLaneWords; ++w)
            ptx::cp_async_16(&sm.weights[stage][b][warp][lane * kLaneWords + w], weights + kb * 32 * kLaneWords + w);
        for (int i = threadIdx.x; i < kRows * 4; i += kThreads) {
          const int rr = i / 4, c = i % 4;
          const int64_t act_row = sm.act_row[rr];
          ptx::cp_async_16(&sm.act[stage][b][((rr / 8) * 4 + c) * kCoreBytes + (rr % 8) * 16],
                           p.act + max(act_row, int64_t{0}) * p.k + kb * kGemmKBlock + c * 16, act_row >= 0);
        }
      }
    };

    float acc[kAcc] = {};
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < stage_count) load_stage(s, s * kBlocksPerStage);
      ptx::cp_async_commit();
    }
    {
      // While the first stages load: each row's Σ a over this split's K blocks and its scale, with
      // kThreadsPerRow threads a row (visible to all after the main loop's first barrier).
      constexpr int kThreadsPerRow = kThreads / kRows;
      const int rr = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
      const int64_t act_row = sm.act_row[rr];
      float sum = 0.0f;
      if (!kFp8 && act_row >= 0) {
        const float* sums = p.act_sums + act_row * kblocks + kb_begin;
#pragma unroll 4
        for (int64_t kb = part; kb < kb_count; kb += kThreadsPerRow) sum += sums[kb];
      }
#pragma unroll
      for (int o = kThreadsPerRow / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
      if (part == 0) {
        sm.token_sum[rr] = sum;
        sm.token_scale[rr] = act_row >= 0 ? p.act_scale[act_row] : 0.0f;
      }
    }
    for (int64_t i = 0; i < stage_count; ++i) {
      ptx::cp_async_wait<kStages - 2>();
      wgmma::fence_proxy_async();  // the copies are generic-proxy writes that wgmma reads
      __syncthreads();  // stage i is complete for all threads; stage i - 1 is free to refill
      if (i + kStages - 1 < stage_count)
        load_stage((i + kStages - 1) % kStages, (i + kStages - 1) * kBlocksPerStage);
      ptx::cp_async_commit();

      const int stage = static_cast<int>(i % kStages);
#pragma unroll
      for (int b = 0; b < kBlocksPerStage; ++b) {
        if (i * kBlocksPerStage + b >= kb_count) break;
        uint32_t a0[4], a1[4];
        if constexpr (kFp8) {  // the two K steps' A fragments, as stored
          const uint4 lo = sm.weights[stage][b][warp][2 * lane], hi = sm.weights[stage][b][warp][2 * lane + 1];
          a0[0] = lo.x, a0[1] = lo.y, a0[2] = lo.z, a0[3] = lo.w;
          a1[0] = hi.x, a1[1] = hi.y, a1[2] = hi.z, a1[3] = hi.w;
        } else {
          // Each nibble u becomes the FP8 byte u, worth u · 2^-9: low nibbles are rows g, high g + 8.
          const uint4 w = sm.weights[stage][b][warp][lane];
          a0[0] = w.x & 0x0F0F0F0Fu, a0[1] = (w.x >> 4) & 0x0F0F0F0Fu;
          a0[2] = w.y & 0x0F0F0F0Fu, a0[3] = (w.y >> 4) & 0x0F0F0F0Fu;
          a1[0] = w.z & 0x0F0F0F0Fu, a1[1] = (w.z >> 4) & 0x0F0F0F0Fu;
          a1[2] = w.w & 0x0F0F0F0Fu, a1[3] = (w.w >> 4) & 0x0F0F0F0Fu;
        }
        const uint8_t* act = sm.act[stage][b];
        float d[kAcc];
        wgmma::fence();
        wgmma::WgmmaE4m3<kRows>::mma(d, a0, wgmma::descriptor(act, kCoreBytes, 4 * kCoreBytes), 0);
        wgmma::WgmmaE4m3<kRows>::mma(d, a1, wgmma::descriptor(act + 2 * kCoreBytes, kCoreBytes, 4 * kCoreBytes), 1);
        wgmma::commit();
        wgmma::wait<0>();
        // Promote every 64-wide K block into fp32 registers.
#pragma unroll
        for (int j = 0; j < kAcc; ++j) acc[j] += d[j];
      }
    }
    ptx::cp_async_wait<0>();

    if (tile_valid) {
      const float* wscale = p.weight_scale + expert * p.n;
      float* out = p.out + (blockIdx.z * p.max_rows + row_begin + chunk) * p.n;
      // Accumulator j: row group j / 4 of 8 tokens; rows g (j % 4 < 2) or g + 8; token 2q + j % 2.
#pragma unroll
      for (int j = 0; j < kAcc; ++j) {
        const int rr = (j / 4) * 8 + 2 * q + (j & 1);
        const int64_t channel = tile * 16 + g + ((j & 2) ? 8 : 0);
        if (chunk + rr >= rows) continue;
        const float dot = kFp8 ? acc[j] : acc[j] * 512.0f - 8.0f * sm.token_sum[rr];
        out[rr * p.n + channel] = dot * sm.token_scale[rr] * wscale[channel];
      }
    }
    __syncthreads();  // the row tables and the pipeline buffers are reused by the next chunk
  }
}

template <int kTokenTiles, bool kFp8>
void launch(const GemmW4A8Args& p, cudaStream_t stream) {
  constexpr int kSmem = sizeof(GemmSmem<kTokenTiles, kFp8>);
  static const bool configured = [] {
    cuda_check(cudaFuncSetAttribute(moe_gemm_w4a8_kernel<kTokenTiles, kFp8>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)configured;
  const int64_t tiles = p.n / 16;
  const dim3 grid(static_cast<unsigned>((tiles + kWarps - 1) / kWarps), static_cast<unsigned>(p.expert_slots),
                  static_cast<unsigned>(p.splits));
  moe_gemm_w4a8_kernel<kTokenTiles, kFp8><<<grid, kThreads, kSmem, stream>>>(p);
  cuda_check(cudaGetLastError());
}

// Rows of the average active expert decide how many token tiles a block holds at once.
int token_tiles_for(int64_t rows, int64_t expert_slots) {
  const int64_t per_expert = (rows + expert_slots - 1) / std::max<int64_t>(1, expert_slots);
  return per_expert <= 8 ? 1 : per_expert <= 16 ? 2 : per_expert <= 32 ? 4 : 8;
}

}  // namespace

int64_t choose_k_splits(int64_t n, int64_t k, int64_t expert_slots, int64_t rows, int num_sms) {
  (void)rows;
  const int64_t kblocks = k / kGemmKBlock;
  const int64_t warps = expert_slots * (n / 16);
  const int64_t target = static_cast<int64_t>(num_sms) * 16;  // warps that keep every SM's memory pipe busy
  int64_t splits = std::clamp<int64_t>((target + warps - 1) / warps, 1, std::max<int64_t>(1, kblocks / 4));
  const int64_t per_split = (kblocks + splits - 1) / splits;
  return (kblocks + per_split - 1) / per_split;  // no empty split
}

void moe_gemm_w4a8(const GemmW4A8Args& p, cudaStream_t stream) {
  check(p.n % 16 == 0 && p.k % kGemmKBlock == 0, "moe_gemm_w4a8: N ", p.n, " and K ", p.k,
        " must be multiples of 16 and 64");
  check(p.splits >= 1 && p.expert_slots >= 1, "moe_gemm_w4a8: bad grid");
  const bool fp8 = p.weight_format == ExpertWeightFormat::kFp8;
  switch (token_tiles_for(p.max_rows, p.expert_slots)) {
    case 1: return fp8 ? launch<1, true>(p, stream) : launch<1, false>(p, stream);
    case 2: return fp8 ? launch<2, true>(p, stream) : launch<2, false>(p, stream);
    case 4: return fp8 ? launch<4, true>(p, stream) : launch<4, false>(p, stream);
    default: return fp8 ? launch<8, true>(p, stream) : launch<8, false>(p, stream);
  }
}

}  // namespace nibble::cuda
