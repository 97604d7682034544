// Grouped INT4 × FP8 GEMM kernel (see moe_gemm_w4a8.h for the contract and the weight layout).
// A block is 4 warps; each warp owns kRowTiles 16-row tiles of one expert's output channels and all
// (up to kTokenTiles × 8) rows of that expert, and walks its K range through an 8-stage cp.async
// pipeline (weights per lane, activations shared by the block). Every 64-wide K block's MMA result
// is added to fp32 registers, so accumulation error does not grow with K.
#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/moe_gemm_w4a8.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 8;
constexpr int kActStride = kGemmKBlock + 16;  // smem bytes per activation row; the pad spreads banks

template <int kRowTiles, int kTokenTiles>
struct alignas(16) GemmSmem {
  uint4 weights[kStages][kWarps][kRowTiles][32];
  uint8_t act[kStages][kTokenTiles * 8][kActStride];
  float token_sum[kTokenTiles * 8];
  float token_scale[kTokenTiles * 8];
};

template <int kRowTiles, int kTokenTiles>
__global__ void __launch_bounds__(kThreads) moe_gemm_w4a8_kernel(const __grid_constant__ GemmW4A8Args p) {
  constexpr int kRows = kTokenTiles * 8;
  extern __shared__ uint4 smem_raw[];
  auto& sm = *reinterpret_cast<GemmSmem<kRowTiles, kTokenTiles>*>(smem_raw);

  const int slot = blockIdx.y;
  if (slot >= p.active_experts[p.num_experts]) return;
  const int expert = p.active_experts[slot];
  const int row_begin = p.expert_offsets[expert];
  const int rows = p.expert_offsets[expert + 1] - row_begin;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;
  const int64_t tiles = p.n / 16, kblocks = p.k / kGemmKBlock;
  const int64_t tile0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRowTiles;
  const int64_t per_split = (kblocks + p.splits - 1) / p.splits;
  const int64_t kb_begin = blockIdx.z * per_split;
  const int64_t kb_count = min(kblocks, kb_begin + per_split) - kb_begin;
  const uint4* weights = static_cast<const uint4*>(p.weights) + expert * tiles * kblocks * 32;

  for (int chunk = 0; chunk < rows; chunk += kRows) {
    auto load_stage = [&](int stage, int64_t kb) {
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r)
        if (tile0 + r < tiles)
          ptx::cp_async_16(&sm.weights[stage][warp][r][lane], weights + ((tile0 + r) * kblocks + kb) * 32 + lane);
      for (int i = threadIdx.x; i < kRows * 4; i += kThreads) {
        const int rr = i / 4, part = i % 4;
        const bool valid = chunk + rr < rows;
        const int sorted = row_begin + (valid ? chunk + rr : 0);
        const int64_t act_row = p.act_row ? p.act_row[sorted] : sorted;
        ptx::cp_async_16(&sm.act[stage][rr][part * 16], p.act + act_row * p.k + kb * kGemmKBlock + part * 16, valid);
      }
    };

    float acc[kRowTiles][kTokenTiles][4] = {};
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < kb_count) load_stage(s, kb_begin + s);
      ptx::cp_async_commit();
    }
    for (int64_t i = 0; i < kb_count; ++i) {
      ptx::cp_async_wait<kStages - 2>();
      __syncthreads();  // stage i is complete for all threads; stage i - 1 is free to refill
      if (i + kStages - 1 < kb_count) load_stage((i + kStages - 1) % kStages, kb_begin + i + kStages - 1);
      ptx::cp_async_commit();

      const int stage = static_cast<int>(i % kStages);
      uint32_t b[kTokenTiles][2][2];
#pragma unroll
      for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const uint8_t* a = &sm.act[stage][nt * 8 + g][32 * s + 4 * q];
          b[nt][s][0] = *reinterpret_cast<const uint32_t*>(a);
          b[nt][s][1] = *reinterpret_cast<const uint32_t*>(a + 16);
        }
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) {
        if (tile0 + r >= tiles) continue;
        const uint4 w = sm.weights[stage][warp][r][lane];
        // Each nibble u becomes the FP8 byte u, worth u · 2^-9: low nibbles are rows g, high g + 8.
        const uint32_t a[2][4] = {{w.x & 0x0F0F0F0Fu, (w.x >> 4) & 0x0F0F0F0Fu, w.y & 0x0F0F0F0Fu, (w.y >> 4) & 0x0F0F0F0Fu},
                                  {w.z & 0x0F0F0F0Fu, (w.z >> 4) & 0x0F0F0F0Fu, w.w & 0x0F0F0F0Fu, (w.w >> 4) & 0x0F0F0F0Fu}};
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt) {
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          ptx::mma_e4m3_16x8x32(d, a[0], b[nt][0]);
          ptx::mma_e4m3_16x8x32(d, a[1], b[nt][1]);
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[r][nt][j] += d[j];
        }
      }
    }
    ptx::cp_async_wait<0>();

    // Per row: Σ a over this split's K blocks, and the activation scale.
    for (int rr = threadIdx.x; rr < kRows; rr += kThreads) {
      float sum = 0.0f, scale = 0.0f;
      if (chunk + rr < rows) {
        const int sorted = row_begin + chunk + rr;
        const int64_t act_row = p.act_row ? p.act_row[sorted] : sorted;
        const float* sums = p.act_sums + act_row * kblocks + kb_begin;
        for (int64_t kb = 0; kb < kb_count; ++kb) sum += sums[kb];
        scale = p.act_scale[act_row];
      }
      sm.token_sum[rr] = sum;
      sm.token_scale[rr] = scale;
    }
    __syncthreads();

    const float* wscale = p.weight_scale + expert * p.n;
    float* out = p.out + (blockIdx.z * p.max_rows + row_begin + chunk) * p.n;
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      if (tile0 + r >= tiles) continue;
#pragma unroll
      for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int rr = nt * 8 + 2 * q + (j & 1);
          const int64_t channel = (tile0 + r) * 16 + g + (j >> 1) * 8;
          if (chunk + rr >= rows) continue;
          const float dot = acc[r][nt][j] * 512.0f - 8.0f * sm.token_sum[rr];
          out[rr * p.n + channel] = dot * sm.token_scale[rr] * wscale[channel];
        }
    }
    __syncthreads();  // token_sum/scale and the pipeline buffers are reused by the next chunk
  }
}

template <int kRowTiles, int kTokenTiles>
void launch(const GemmW4A8Args& p, cudaStream_t stream) {
  constexpr int kSmem = sizeof(GemmSmem<kRowTiles, kTokenTiles>);
  static const bool configured = [] {
    cuda_check(cudaFuncSetAttribute(moe_gemm_w4a8_kernel<kRowTiles, kTokenTiles>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)configured;
  const int64_t tiles = p.n / 16;
  const dim3 grid(static_cast<unsigned>((tiles + kWarps * kRowTiles - 1) / (kWarps * kRowTiles)),
                  static_cast<unsigned>(p.expert_slots), static_cast<unsigned>(p.splits));
  moe_gemm_w4a8_kernel<kRowTiles, kTokenTiles><<<grid, kThreads, kSmem, stream>>>(p);
  cuda_check(cudaGetLastError());
}

// Rows of the average active expert decide how many token tiles a block holds at once.
int token_tiles_for(int64_t rows, int64_t expert_slots) {
  const int64_t per_expert = (rows + expert_slots - 1) / std::max<int64_t>(1, expert_slots);
  return per_expert <= 8 ? 1 : per_expert <= 16 ? 2 : per_expert <= 32 ? 4 : 8;
}

}  // namespace

int64_t choose_k_splits(int64_t n, int64_t k, int64_t expert_slots, int64_t rows, int num_sms) {
  const int row_tiles = token_tiles_for(rows, expert_slots) <= 2 ? 2 : 1;
  const int64_t kblocks = k / kGemmKBlock;
  const int64_t warps = expert_slots * ((n / 16 + row_tiles - 1) / row_tiles);
  const int64_t target = static_cast<int64_t>(num_sms) * 16;  // warps that keep every SM's memory pipe busy
  int64_t splits = std::clamp<int64_t>((target + warps - 1) / warps, 1, std::max<int64_t>(1, kblocks / 4));
  const int64_t per_split = (kblocks + splits - 1) / splits;
  return (kblocks + per_split - 1) / per_split;  // no empty split
}

void moe_gemm_w4a8(const GemmW4A8Args& p, cudaStream_t stream) {
  check(p.n % 16 == 0 && p.k % kGemmKBlock == 0, "moe_gemm_w4a8: N ", p.n, " and K ", p.k,
        " must be multiples of 16 and 64");
  check(p.splits >= 1 && p.expert_slots >= 1, "moe_gemm_w4a8: bad grid");
  switch (token_tiles_for(p.max_rows, p.expert_slots)) {
    case 1: return launch<2, 1>(p, stream);
    case 2: return launch<2, 2>(p, stream);
    case 4: return launch<1, 4>(p, stream);
    default: return launch<1, 8>(p, stream);
  }
}

}  // namespace nibble::cuda
