// The MoE decode GEMM's 64-row stage built up from its chain, one piece at a time, to find where a
// block's stage goes from the chain's cycles (bench/probe_chain_rate.cu) to the real kernel's (about
// 730 SM cycles with no copies, about 1000 with them: bench/RESULTS.md, thirty-seventh session).
// Each level adds one piece of moe_gemm_w4a8.cu's INT4 64-row tiles to the one before:
//   0  the chain alone: eight wgmma m64nNk32 e4m3 (A from registers, new masks of a changing word each
//      stage; B from the stage's 128-byte-swizzled activation slot), committed, waited for, its sums
//      added to fp32 registers;
//   1  + the ring's hand-offs: a producer warp waits for a free slot and arrives on its `full`
//      barrier (no bytes), the consumers wait for it and each warp's lane 0 arrives on `empty`;
//   2  + A from the slot's weights in shared memory (four 16-byte loads a lane and the nibble masks);
//   3  + the weights' bulk copies from HBM (four 2 KB copies a stage, a 1 GiB buffer streamed);
//   4  + the activations' 16 KB a stage from L2 (a small buffer, one bulk copy);
//   5  + the chain's width chosen every stage by a warp vote, n32 or n64 (both compiled, the sums added
//      inside each branch, as the kernel's narrow chains), chunks of 16 stages (Mixtral's gate_up K)
//      of 40 rows (n64) five times in eight, else 28 (n32);
//   6  + the chunk's write-out at its last stage: a named barrier, each row's sum and scale through
//      shared memory, the gated activation of the 32 sums to global memory, the sums zeroed;
//   7  + the next chunk's unit looked up in L2 after the write-out, as the kernel's consumers walk
//      (the active expert, then its row offsets: two dependent loads), its rows deciding the width;
//   8  level 7 with the write-out's two weight scales loaded once before its stores (the kernel's
//      experiment, measured flat and removed) rather than after each store, which may alias them;
//   9  level 8 with the producer walking units as the kernel's does: at each chunk's first stage it
//      looks the unit up in L2 (two dependent loads) before that stage's copies.
// Levels 1 and 9 also run with no chain (no wgmma, no weights read: the skeleton of ring, walk and
// write-out alone, no copies).
// Levels 5 to 8 run at n64 only (their widest chain), with the copies of levels 3-4 and without (the
// producer only arrives, as at levels 1-2), so that a consumer-side cost shows past the copies' bound.
// Grid-wide, a stage's weight copies read consecutive 8 KB pieces, so that no two blocks read the
// same bytes within the 1 GiB pass (L2 holds 50 MB). Levels 3, 4 and 7 also run with the kernel's
// weight streams (unit streams): a block's chunk of 16 stages is a unit of 64 channels of an expert
// with K 4096, its four warps' tiles 32 KB apart, each stage 2 KB on in each of the four; block b
// takes units b, b + grid, ..., so that the grid reads from as many 128 KB regions as it has blocks.
// Blocks of one consumer warpgroup and a producer warp, four stages of 8 KB of weights and 16 KB of
// activations, at one and two blocks an SM, as the kernel's 64-row tiles. Not part of the build (a
// measurement tool):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc bench/probe_stage_rate.cu -o /tmp/probe_stage
//   /tmp/probe_stage
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "cuda/ptx.cuh"
#include "cuda/wgmma.cuh"
#include "probe_blocks.cuh"

namespace {

namespace wg = nibble::cuda::wgmma;
namespace ptx = nibble::cuda::ptx;

constexpr int kIters = 1024, kStages = 4, kConsumers = 128, kThreads = kConsumers + 32;
constexpr int kRows = 64, kHalfBytes = kRows * 128, kActBytes = 2 * kHalfBytes;
constexpr int kWarpBytes = 4 * 32 * 16;  // a warp's four K blocks of 16 channels
constexpr int kWeightBytes = 4 * kWarpBytes, kStageBytes = kWeightBytes + kActBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 1024;
constexpr int64_t kStreamBytes = int64_t{1} << 30;  // the weights' HBM buffer
constexpr int kActBufferBytes = 1 << 20;            // the activations' L2-resident buffer
constexpr int kChunkStages = 16;                     // levels 5-6: a chunk's stages (K 4096)
constexpr int kOutFloats = 64 * 32;                  // level 6: a block's gated outputs, 64 rows × 32 channels

struct Barriers {
  uint64_t full[kStages];
  uint64_t empty[kStages];
  float token_sum[kRows];
  float token_scale[kRows];
};

// Level 5 onwards: a chunk's live rows (the same in every lane).
__device__ __host__ inline int unit_rows(int unit) { return unit % 8 < 5 ? 40 : 28; }
__device__ inline int chunk_rows(int it) { return unit_rows(it / kChunkStages); }
constexpr int kUnits = 64;  // level 7: the units' lookups, kUnits experts of unit_rows rows

enum Copies : int { kNoCopies, kSequential, kUnitStreams };

template <int kLevel, int N, int kCopies, bool kChain = true>
__global__ void __launch_bounds__(kThreads) stage_rate(const uint8_t* weights, const uint8_t* acts,
                                                      const float* wscale, float* out, const int* experts,
                                                      const int* offsets, long long* cycles, float* sink) {
  static_assert(kLevel < 5 || N == 64, "levels 5 to 8 choose n32 or n64 chains");
  constexpr bool kWeightCopies = kLevel >= 3 && kCopies != kNoCopies, kActCopies = kLevel >= 4 && kCopies != kNoCopies;
  extern __shared__ uint8_t raw[];
  __shared__ Barriers bars;
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(raw)) & 1023;
  uint8_t* stages = raw + ((1024 - misalign) & 1023);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  for (int i = threadIdx.x; i < kStages * kStageBytes; i += blockDim.x) stages[i] = static_cast<uint8_t>(i * 7);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&bars.full[s], 1);
      ptx::mbarrier_init(&bars.empty[s], kConsumers / 32);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  wg::fence_proxy_async();
  __syncthreads();

  if (warp == kConsumers / 32) {  // the producer
    if (kLevel == 0 || lane != 0) return;
    const int64_t stream_stages = kStreamBytes / kWeightBytes;
    for (int it = 0; it < kIters; ++it) {
      const int slot = it % kStages;
      if (it >= kStages) ptx::mbarrier_wait(&bars.empty[slot], ((it / kStages) - 1) & 1);
      if (kLevel >= 9 && it % kChunkStages == 0) {  // the unit's lookups, as the kernel's producer walks
        const int expert = __ldcg(experts + (it / kChunkStages) % kUnits);
        if (__ldcg(offsets + expert) < 0) return;  // never: the offsets count up from 0
      }
      uint8_t* stage = stages + slot * kStageBytes;
      if constexpr (kWeightCopies) {
        ptx::mbarrier_arrive_expect_tx(&bars.full[slot], kWeightBytes + (kActCopies ? kActBytes : 0));
        const int64_t at = ((int64_t{it} * gridDim.x + blockIdx.x) % stream_stages) * kWeightBytes;
        constexpr int64_t kTileBytes = int64_t{kChunkStages} * kWarpBytes, kUnitBytes = 4 * kTileBytes;
        const int64_t unit = int64_t{it / kChunkStages} * gridDim.x + blockIdx.x;
        const int64_t unit_at = (unit % (kStreamBytes / kUnitBytes)) * kUnitBytes + (it % kChunkStages) * kWarpBytes;
        for (int w = 0; w < 4; ++w)
          ptx::bulk_copy_to_shared(stage + w * kWarpBytes,
                                   weights + (kCopies == kUnitStreams ? unit_at + w * kTileBytes : at + w * kWarpBytes),
                                   kWarpBytes, &bars.full[slot]);
        if constexpr (kActCopies) {
          const int at_act = ((blockIdx.x * 7 + it) * kActBytes) % kActBufferBytes;
          ptx::bulk_copy_to_shared(stage + kWeightBytes, acts + at_act, kActBytes, &bars.full[slot]);
        }
      } else {
        ptx::mbarrier_arrive(&bars.full[slot]);
      }
    }
    return;
  }

  const uint64_t desc = wg::descriptor_sw128(stages + kWeightBytes);
  const auto desc_lo = static_cast<uint32_t>(desc);
  const uint64_t desc_hi = desc & 0xFFFFFFFF00000000ull;
  uint32_t word = threadIdx.x * 0x01010101u;
  float acc[N / 2] = {};
  float d[N / 2];
  int rows_looked_up = unit_rows(0);  // level 7
  const long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
    const int slot = it % kStages;
    if constexpr (kLevel >= 1) ptx::mbarrier_wait(&bars.full[slot], (it / kStages) & 1);
    uint32_t a[4][2][4];
    const uint32_t m = 0x0F0F0F0Fu;
    if constexpr (!kChain) {
      for (auto& row : a)
        for (auto& half : row)
          for (uint32_t& v : half) v = 0;
    } else if constexpr (kLevel >= 2) {  // as the kernel: low nibbles rows g, high g + 8
      const auto* w = reinterpret_cast<const uint4*>(stages + slot * kStageBytes + warp * kWarpBytes);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint4 v = w[b * 32 + lane];
        a[b][0][0] = v.x & m, a[b][0][1] = (v.x >> 4) & m, a[b][0][2] = v.y & m, a[b][0][3] = (v.y >> 4) & m;
        a[b][1][0] = v.z & m, a[b][1][1] = (v.z >> 4) & m, a[b][1][2] = v.w & m, a[b][1][3] = (v.w >> 4) & m;
      }
    } else {
      nibble::probe::next_a_fragments(word, a);
    }
    auto chain = [&](auto width) {
      constexpr int kN = decltype(width)::value;
      float(&dn)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&d[0]);
      wg::fence();
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t lo = desc_lo + ((slot * kStageBytes + (b / 2) * kHalfBytes + (b % 2) * 64) >> 4);
        wg::WgmmaE4m3<kN>::mma(dn, a[b][0], desc_hi | lo, b);
        wg::WgmmaE4m3<kN>::mma(dn, a[b][1], desc_hi | (lo + 2), 1);
      }
      wg::commit();
      wg::wait<0>();
#pragma unroll
      for (int j = 0; j < kN / 2; ++j) acc[j] += dn[j];
    };
    if constexpr (!kChain) {
      acc[0] += static_cast<float>(slot);
    } else if constexpr (kLevel >= 5) {
      if (__all_sync(0xFFFFFFFFu, (kLevel >= 7 ? rows_looked_up : chunk_rows(it)) <= 32))
        chain(std::integral_constant<int, 32>{});
      else
        chain(std::integral_constant<int, 64>{});
    } else {
      chain(std::integral_constant<int, N>{});
    }
    if (kLevel >= 1 && lane == 0) ptx::mbarrier_arrive(&bars.empty[slot]);
    if constexpr (kLevel >= 6) {
      if (it % kChunkStages == kChunkStages - 1) {  // as the kernel's glu write-out of 64-row tiles
        const int rr = threadIdx.x / 2;
        const float sum = __shfl_xor_sync(0xFFFFFFFFu, acc[0] * 0.25f, 1);
        ptx::named_barrier_sync(1, kConsumers);
        if (threadIdx.x % 2 == 0) {
          bars.token_sum[rr] = sum;
          bars.token_scale[rr] = 1.0f / (1 + rr);
        }
        ptx::named_barrier_sync(1, kConsumers);
        const int g = lane >> 2, q = lane & 3, rows = chunk_rows(it);
        float* block_out = out + blockIdx.x * kOutFloats;
        const int c16 = warp * 16 + g;
        [[maybe_unused]] float lean_wscale[2] = {};
        if constexpr (kLevel >= 8) lean_wscale[0] = __ldg(wscale + c16), lean_wscale[1] = __ldg(wscale + c16 + 8);
#pragma unroll
        for (int j = 0; j < N / 2; ++j) {
          if (j & 2) continue;
          const int row = (j / 4) * 8 + 2 * q + (j & 1);
          auto value = [&](int k, int channel) {
            const float ws = kLevel >= 8 ? lean_wscale[channel == c16 ? 0 : 1] : __ldg(wscale + channel);
            return (acc[k] * 512.0f - 8.0f * bars.token_sum[row]) * bars.token_scale[row] * ws;
          };
          const float gate = value(j, c16), up = value(j + 2, c16 + 8);
          const float h = gate / (1.0f + __expf(-gate)) * up;
          if (row < rows) block_out[row * 32 + warp * 8 + g] = h;
        }
#pragma unroll
        for (int j = 0; j < N / 2; ++j) acc[j] = 0.0f;
        if constexpr (kLevel >= 7) {
          const int expert = __ldcg(experts + (it / kChunkStages + 1) % kUnits);
          const int row_begin = __ldcg(offsets + expert);
          rows_looked_up = __ldcg(offsets + expert + 1) - row_begin;
        }
      }
    }
  }
  nibble::probe::finish_block(start, acc, cycles, sink);
}

template <int kLevel, int N, int kCopies = kSequential, bool kChain = true>
void report(const uint8_t* weights, const uint8_t* acts, const float* wscale, float* out, const int* experts,
            const int* offsets, int blocks_per_sm) {
  const auto t = nibble::probe::time_blocks(stage_rate<kLevel, N, kCopies, kChain>, blocks_per_sm, kThreads, kSmemBytes, weights, acts,
                                            wscale, out, experts, offsets);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const double per_stage = static_cast<double>(t.most_cycles) / kIters;  // a block's stage, wall cycles
  const double weight_gbs = static_cast<double>(sms) * blocks_per_sm * kIters * kWeightBytes / (t.ms * 1e6);
  std::printf("level %d%s%s n%-3d %d blocks/SM: %7.1f cycles a block's stage, %7.1f SM cycles a stage; %.1f us, "
              "weights %.0f GB/s if copied (%s)\n",
              kLevel, kChain ? "" : " (no chain)",
              kLevel < 3 ? "" : kCopies == kNoCopies ? " (no copies)" : kCopies == kUnitStreams ? " (unit streams)" : "", N, blocks_per_sm, per_stage, per_stage / blocks_per_sm, t.ms * 1e3, weight_gbs,
              cudaGetErrorString(cudaGetLastError()));
}

template <int N>
void report_levels(const uint8_t* weights, const uint8_t* acts, const float* wscale, float* out, const int* experts,
                   const int* offsets) {
  for (int bps : {1, 2}) {
    report<0, N>(weights, acts, wscale, out, experts, offsets, bps);
    report<1, N>(weights, acts, wscale, out, experts, offsets, bps);
    report<2, N>(weights, acts, wscale, out, experts, offsets, bps);
    report<3, N>(weights, acts, wscale, out, experts, offsets, bps);
    report<4, N>(weights, acts, wscale, out, experts, offsets, bps);
    if constexpr (N == 64) {
      report<5, N>(weights, acts, wscale, out, experts, offsets, bps);
      report<6, N>(weights, acts, wscale, out, experts, offsets, bps);
      report<7, N>(weights, acts, wscale, out, experts, offsets, bps);
      report<8, N>(weights, acts, wscale, out, experts, offsets, bps);
      report<5, N, kNoCopies>(weights, acts, wscale, out, experts, offsets, bps);
      report<6, N, kNoCopies>(weights, acts, wscale, out, experts, offsets, bps);
      report<7, N, kNoCopies>(weights, acts, wscale, out, experts, offsets, bps);
      report<8, N, kNoCopies>(weights, acts, wscale, out, experts, offsets, bps);
      report<3, N, kUnitStreams>(weights, acts, wscale, out, experts, offsets, bps);
      report<4, N, kUnitStreams>(weights, acts, wscale, out, experts, offsets, bps);
      report<7, N, kUnitStreams>(weights, acts, wscale, out, experts, offsets, bps);
      report<9, N>(weights, acts, wscale, out, experts, offsets, bps);
      report<9, N, kNoCopies>(weights, acts, wscale, out, experts, offsets, bps);
      report<1, N, kNoCopies, false>(weights, acts, wscale, out, experts, offsets, bps);
      report<9, N, kNoCopies, false>(weights, acts, wscale, out, experts, offsets, bps);
    }
  }
}

}  // namespace

int main() {
  uint8_t* weights;
  uint8_t* acts;
  float* wscale;
  float* out;
  int* experts;
  int* offsets;
  if (cudaMalloc(&weights, kStreamBytes) != cudaSuccess || cudaMalloc(&acts, kActBufferBytes) != cudaSuccess ||
      cudaMalloc(&wscale, 64 * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&out, size_t{1024} * kOutFloats * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&experts, kUnits * sizeof(int)) != cudaSuccess ||
      cudaMalloc(&offsets, (kUnits + 1) * sizeof(int)) != cudaSuccess) {
    std::fprintf(stderr, "probe_stage_rate: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  cudaMemset(weights, 0x35, kStreamBytes);
  cudaMemset(acts, 0x21, kActBufferBytes);
  cudaMemset(wscale, 0, 64 * sizeof(float));
  // Unit u is expert (u · 5) mod kUnits, whose rows are unit_rows(u): the same widths as levels 5-6.
  std::vector<int> host_experts(kUnits), host_rows(kUnits), host_offsets(kUnits + 1, 0);
  for (int u = 0; u < kUnits; ++u) host_experts[u] = (u * 5) % kUnits, host_rows[host_experts[u]] = unit_rows(u);
  for (int e = 0; e < kUnits; ++e) host_offsets[e + 1] = host_offsets[e] + host_rows[e];
  cudaMemcpy(experts, host_experts.data(), kUnits * sizeof(int), cudaMemcpyHostToDevice);
  cudaMemcpy(offsets, host_offsets.data(), (kUnits + 1) * sizeof(int), cudaMemcpyHostToDevice);
  report_levels<32>(weights, acts, wscale, out, experts, offsets);
  report_levels<64>(weights, acts, wscale, out, experts, offsets);
  cudaFree(weights);
  cudaFree(acts);
  cudaFree(wscale);
  cudaFree(out);
  cudaFree(experts);
  cudaFree(offsets);
  return 0;
}
