// The register-streaming decode MoE GEMM (moe_gemm_w4a8_stream.h). A warp walks units of (active
// expert, 64 output channels, K split) with a grid-wide stride; for each it keeps kAhead 64-wide K
// blocks of weights (four 16-channel tiles, 16 bytes a lane each, read once and not kept in L1) and
// of its rows' activations (4 bytes a lane a K step, from L2) in flight in registers ahead of the
// math, turns them into f16 fragments (int4_f16_mma.cuh) and sums them with mma.sync m16n8k16 into
// fp32. A unit's split is the warp's alone, so its sums go straight out: no shared memory, no
// barriers, no hand-offs between warps.
#include "cuda/moe_gemm_w4a8_stream.h"

#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/int4_f16_mma.cuh"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kWarps = 4;  // a block's warps, each on units of its own
constexpr int kThreads = kWarps * 32;
constexpr int kTiles = 4;         // 16-channel tiles a unit: 64 output channels
constexpr int kTileBlockBytes = 512;  // a tile's K block in the repacked layout: 32 lanes × 16 bytes
static_assert(kTileBlockBytes == 32 * 16 && kGemmKBlock == 64, "repacked INT4 layout (moe_gemm_w4a8.h)");

// 16 bytes read once: through the non-coherent path, not kept in L1.
__device__ inline uint4 load_once(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <int kTokenTiles>
struct Stream {
  static constexpr int kRows = kTokenTiles * 8;
  static constexpr int kAhead = kTokenTiles == 1 ? 3 : 2;  // K blocks in flight (registers permitting)
  static constexpr int kMinBlocks = stream_warps_per_sm(kTokenTiles) / kWarps;  // 4 or 3 (no spills)
};

template <int kTokenTiles>
__global__ void __launch_bounds__(kThreads, Stream<kTokenTiles>::kMinBlocks)
    moe_gemm_stream_kernel(const __grid_constant__ GemmW4A8Args p) {
  using S = Stream<kTokenTiles>;
  constexpr int kRows = S::kRows, kAhead = S::kAhead;
  ptx::grid_dependency_wait();  // the routing and the activations come from the kernels before
  ptx::launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;
  const int tiles = static_cast<int>(p.n / 16);
  const int groups = (tiles + kTiles - 1) / kTiles;
  const int splits = static_cast<int>(p.splits);
  const int kblocks = static_cast<int>(p.k / kGemmKBlock);
  const int per_split = (kblocks + splits - 1) / splits;
  const int units = p.active_experts[p.num_experts] * groups * splits;
  const auto* weights = static_cast<const uint8_t*>(p.weights);

  for (int unit = static_cast<int>(blockIdx.x) * kWarps + warp; unit < units;
       unit += static_cast<int>(gridDim.x) * kWarps) {
    const int slot = unit / (groups * splits), rest = unit % (groups * splits);
    const int group = rest / splits, split = rest % splits;
    const int expert = p.active_experts[slot];
    const int row_begin = p.expert_offsets[expert];
    const int rows = p.expert_offsets[expert + 1] - row_begin;
    const int kb_begin = split * per_split;
    const int kb_count = min(kblocks, kb_begin + per_split) - kb_begin;
    // This lane's 16 bytes of each tile's first K block (a tile past N reads the last one; its sums
    // are never written).
    const uint8_t* wsrc[kTiles];
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt) {
      const int tile = min(group * kTiles + mt, tiles - 1);
      wsrc[mt] = weights + ((static_cast<int64_t>(expert) * tiles + tile) * kblocks + kb_begin) * kTileBlockBytes +
                 lane * 16;
    }

    for (int chunk = 0; chunk * kRows < rows; ++chunk) {
      const int live = min(kRows, rows - chunk * kRows);  // rows of this chunk
      // Row g of each 8-row tile, from K 4q of the split's first K block (a row past the chunk reads
      // its first row: it only feeds its own output column, never written).
      const uint8_t* asrc[kTokenTiles];
#pragma unroll
      for (int nt = 0; nt < kTokenTiles; ++nt) {
        const int r = nt * 8 + g < live ? nt * 8 + g : 0;
        const int64_t pos = row_begin + chunk * kRows + r;
        asrc[nt] = p.act + (p.act_row ? p.act_row[pos] : pos) * p.k + kb_begin * kGemmKBlock + 4 * q;
      }
      float acc[kTiles][kTokenTiles][4] = {};
      uint4 w[kAhead][kTiles];
      uint32_t x[kAhead][kTokenTiles][4];
      // K block kb of the split into buffer d.
      auto load = [&](int d, int kb) {
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt) w[d][mt] = load_once(wsrc[mt] + kb * kTileBlockBytes);
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
          for (int s = 0; s < 4; ++s)
            // A plain load, not the non-coherent path: the activations come from the kernel before,
            // which under programmatic dependent launch may still run while this one starts.
            x[d][nt][s] = nt * 8 < live ? *reinterpret_cast<const uint32_t*>(asrc[nt] + kb * kGemmKBlock + s * 16)
                                        : 0u;
      };
#pragma unroll
      for (int d = 0; d < kAhead; ++d)
        if (d < kb_count) load(d, d);
      for (int base = 0; base < kb_count; base += kAhead) {
#pragma unroll
        for (int d = 0; d < kAhead; ++d) {
          const int kb = base + d;
          if (kb < kb_count) {
#pragma unroll
            for (int s = 0; s < 4; ++s) {
              uint32_t b[kTokenTiles][2];
#pragma unroll
              for (int nt = 0; nt < kTokenTiles; ++nt) int4_f16::activation_fragment(x[d][nt][s], b[nt]);
#pragma unroll
              for (int mt = 0; mt < kTiles; ++mt) {
                const uint4& wd = w[d][mt];
                uint32_t a[4];
                int4_f16::weight_fragment(s == 0 ? wd.x : s == 1 ? wd.y : s == 2 ? wd.z : wd.w, a);
#pragma unroll
                for (int nt = 0; nt < kTokenTiles; ++nt)
                  if (nt == 0 || nt * 8 < live) int4_f16::mma(acc[mt][nt], a, b[nt]);
              }
            }
            if (kb + kAhead < kb_count) load(d, kb + kAhead);
          }
        }
      }

      // Σ a over the split's K blocks of this lane's rows (INT4's offset correction) and their
      // scales: rows 8·nt + 2q + i.
      float row_sum[kTokenTiles][2] = {}, row_scale[kTokenTiles][2] = {};
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= live) break;
        const int64_t pos = row_begin + chunk * kRows + r;
        const int64_t act_row = p.act_row ? p.act_row[pos] : pos;
        float sum = 0.0f;
        for (int kb = lane; kb < kb_count; kb += 32) sum += p.act_sums[act_row * kblocks + kb_begin + kb];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
        if ((r & 7) / 2 == q) {
          row_sum[r / 8][r & 1] = sum;
          row_scale[r / 8][r & 1] = p.act_scale[act_row];
        }
      }
      float* out = p.out + (static_cast<int64_t>(split) * p.max_rows + row_begin + chunk * kRows) * p.n;
      const float* wscale = p.weight_scale + static_cast<int64_t>(expert) * p.n;
#pragma unroll
      for (int mt = 0; mt < kTiles; ++mt) {
        const int tile = group * kTiles + mt;
        if (tile >= tiles) break;
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            // Accumulator j: channel g (j < 2) or g + 8, row 8·nt + 2q + j % 2.
            const int row = nt * 8 + 2 * q + (j & 1);
            if (row >= live) continue;
            const int64_t channel = tile * 16 + g + ((j & 2) ? 8 : 0);
            const float dot = acc[mt][nt][j] * ((j & 2) ? int4_f16::kHighScale : int4_f16::kLowScale) -
                              8.0f * row_sum[nt][j & 1];
            out[row * p.n + channel] = dot * row_scale[nt][j & 1] * wscale[channel];
          }
      }
    }
  }
}

template <int kTokenTiles>
void launch(const GemmW4A8Args& p, cudaStream_t stream) {
  auto* kernel = moe_gemm_stream_kernel<kTokenTiles>;
  static const int resident = [&] {
    int blocks = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
    return std::max(blocks, 1);
  }();
  const int64_t groups = (p.n / 16 + kTiles - 1) / kTiles;
  const int64_t units = p.expert_slots * groups * p.splits;  // at most: experts may be inactive
  const int64_t blocks =
      std::clamp<int64_t>((units + kWarps - 1) / kWarps, 1, int64_t{multiprocessor_count()} * resident);
  launch_kernel(kernel, static_cast<unsigned>(blocks), kThreads, 0, stream, p);
}

}  // namespace

void launch_moe_gemm_stream(const GemmW4A8Args& p, int token_tiles, cudaStream_t stream) {
  check(p.weight_format == ExpertWeightFormat::kInt4 && (token_tiles == 1 || token_tiles == 2),
        "moe_gemm_w4a8: the streaming kernel takes INT4 weights and up to 16 rows a tile");
  if (token_tiles == 1) return launch<1>(p, stream);
  launch<2>(p, stream);
}

}  // namespace nibble::cuda
