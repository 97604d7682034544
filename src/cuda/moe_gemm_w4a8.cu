// Grouped INT4 × FP8 (or FP8 × FP8) GEMM kernel (see moe_gemm_w4a8.h for the contract and the weight
// layouts), shaped for decode: bound by the bytes of the weights, which stream once.
// Work is cut into units of (active expert, 64 or 128 output channels, K split); a persistent grid of
// blocks walks them with a static stride (units per block differ by at most one), each unit chunk by
// chunk of kRows rows (one chunk unless an expert has more rows than the tile). Each block is one (or
// two, sharing the activations) consumer warpgroups and one producer warp (128-row tiles: a producer
// warpgroup, one warp of which copies, that hands its registers to the two consumer warpgroups): the
// producer runs the block's pipeline across its units (no fill or drain between them), each consumer
// warp's weights for a stage arriving as one bulk copy and the activations as two boxes of a TMA
// tensor map (mma.sync: a bulk copy a row), all completing on the stage's mbarrier; the consumers hand
// each slot back on a second mbarrier.
// wgmma: weights go to registers as wgmma A fragments; activations (rows in sorted order, so that a
// chunk's rows are one box) sit in shared memory 128-byte swizzled, as wgmma's SWIZZLE_128B operands.
// The tensor cores sum 256 K at a time (a stage); every 256 K is added to fp32 registers, so
// accumulation error does not grow with K.
// mma.sync (GemmMath::kMmaSync): each warp takes one K block of the stage across the block's 64
// channels (m16n8k16 f16, fp32 sums); the warps' partial sums meet in shared memory at a unit's end.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/activation.cuh"
#include "cuda/cuda_check.h"
#include "cuda/env_setting.h"
#include "cuda/device.h"
#include "cuda/kernel_attributes.h"
#include "cuda/int4_f16_mma.cuh"
#include "cuda/launch.h"
#include "cuda/moe_gemm_w4a8.h"
#include "cuda/ptx.cuh"
#include "cuda/tensor_map.h"
#include "cuda/wgmma.cuh"

namespace nibble::cuda {
namespace {

constexpr int kBlocksPerStage = 4;  // 64-wide K blocks per pipeline stage (256 K)
// How far past the pipeline L2 is asked to fetch weights (0: no L2 prefetch), and K splits aimed at
// this many units per SM; NIBBLE_MOE_PREFETCH_STAGES and NIBBLE_MOE_UNITS_PER_SM override them (tuning).
// Measured on an H200 (bench/RESULTS.md, 2026-11-29): with the bulk copies' pipeline, an L2 prefetch
// 4 stages ahead cost 10-16% at 1-32 tokens, and 6 units per SM beat 12 and 24.
constexpr int kPrefetchStages = 0;
constexpr int kUnitsPerSm = 6;
// A K split keeps at least this many stages (a unit's pipeline runs long enough to pay for its start),
// unless the GPU would then hold fewer than kMinUnitsPerSm units an SM; NIBBLE_MOE_MIN_UNIT_STAGES
// overrides it (tuning). Measured on an H200
// (bench/RESULTS.md, twelfth session, the MoE layer graph-replayed, one token, µs with 3 / 4 / 5 / 6
// units an SM): Mixtral 78.7 / 82.1 / 80.8 / 82.1 (its down projection in 4 / 5 / 5 / 7 splits of
// 14 / 11 / 11 / 8 stages), Grok-1 tp 2 117.4 / 117.5 / 108.7 / 112.1 (3 / 3 / 4 / 5 splits of 22 / 22
// / 16 / 13 stages); Mixtral-8x7B decode at batch 1 3.67 ms a step at 3 units against 3.77.
constexpr int kMinUnitStages = 14;
constexpr int kMinUnitsPerSm = 2;
// The 128-row tiles' K splits aim at this many 128-row chunks an SM instead (choose_k_splits). Measured
// on an H100 (bench/RESULTS.md, thirtieth session, the layer graph-replayed, µs, two rounds, against 6
// units an SM): Mixtral 256 tokens 491.1, 489.0 (its down projection in 2 splits; 1 chunk an SM, 1
// split: 485.3, 488.0) against 497.1, 495.8 (4 splits); Grok-1 tp 2 256 765.6, 766.7 against 785.1,
// 781.1 (1 split, 3 before); at 1024 tokens (1 split, 4 and 3 before) Mixtral 1366.1, 1370.4 against 1372.0,
// 1370.7, Grok-1 tp 2 2189.7, 2188.6 against 2179.8, 2178.4.
constexpr int kWideUnitsPerSm = 2;
// With settled routing, stages past the first kStages whose weights L2 is asked for before the grid
// dependency wait; NIBBLE_MOE_EARLY_L2_STAGES overrides it (tuning). Measured on an H200
// (bench/RESULTS.md, 2026-11-30, nibble-bench-moe, the MoE layer graph-replayed, µs at 0 / 4 / 8
// stages): Mixtral 1 token 81.1 / 84.0 / 85.5, 32 tokens 237.8 / 239.3 / 242.0; Grok-1 tp 2 1 token
// 110.6 / 113.8 / 116.4, 32 tokens 367.5 / 370.5 / 371.5. So none. Again with the down GEMM launched as
// the activation starts (eighteenth session, Mixtral-8x7B W4A8 decode, ms a step at 0 / 4 / 10 stages):
// batch 1 3.40 / 3.45 / 3.52, batch 32 9.63 / 9.71.
constexpr int kEarlyL2Stages = 0;
// Timing experiments (bench/RESULTS.md): NIBBLE_MOE_LEAVE_OUT is a sum of what is left out: 1 the
// consumers' math, 2 the activation copies, 4 the weight copies (wrong results; the time of the rest).
enum LeaveOut : int { kNothing = 0, kMath = 1, kActivations = 2, kWeights = 4 };
// Leaving the math out (1) needs a build with -DNIBBLE_MOE_LEAVE_OUT_MATH=1: its runtime branch in the
// consumers' stage loop made ptxas copy the INT4 64-row tiles' 32 sums between registers every stage
// (a register join it could not coalesce), about a sixth of their loop's instructions, so those
// kernels leave it out of other builds. The other kernels keep the branch (never taken there): without
// it ptxas serialized the wgmmas of the 128-row tiles and the FP8 64-row tiles (C7511, too few
// registers for the wgmma pipeline).
#ifndef NIBBLE_MOE_LEAVE_OUT_MATH
#define NIBBLE_MOE_LEAVE_OUT_MATH 0
#endif
// Consumer warpgroups a wgmma block (64 output channels each, sharing the stage's activations): two
// for 16-row tiles of wide projections (N >= kTwoGroupsMinN), else one; NIBBLE_MOE_CONSUMER_GROUPS
// (1 or 2) overrides. Measured on an H200 (bench/RESULTS.md, 2026-11-30), ncu µs at 32 tokens, one
// group against two: Mixtral gate_up (N 28672) 166.3 / 157.5, down (N 4096) 80.5 / 78.8; Grok-1 tp 2
// gate_up (N 32768) 266 / 257.7, down (N 6144) 135 / 149.5; at 8-row tiles two lost (Grok-1 8 tokens
// gate_up 187.5 / 208.5).
constexpr int64_t kTwoGroupsMinN = 16384;
// The most rows a tile (NIBBLE_MOE_MAX_TILE_ROWS=64 overrides): 128, with two consumer warpgroups and a
// producer warpgroup. Measured on an H200 (bench/RESULTS.md, 2026-11-30, eleventh session), the MoE
// layer on the decode path, µs with tiles of up to 64 / 128 rows: Mixtral 256 tokens 538.8 / 530.1,
// 1024 1701.8 / 1378.3, 4096 6204.5 / 4694.6; Grok-1 tp 2 256 965.8 / 855.4, 1024 2939.4 / 2261.4.
constexpr int kMaxTileRows = 128;
// The decode tiles' tensor-core instructions (moe_gemm_w4a8.h: GemmMath) unless NIBBLE_MOE_MATH says:
// wgmma for every tile (mma.sync for tiles of up to kMmaMaxTokenTiles 8-row tiles: none). Measured on an
// H200: in the sixth session (ncu µs of gate_up / down) mma.sync won at 8-row tiles, Mixtral 1 token
// 37.3 / 22.0 against 42.3 / 34.7, Grok-1 (tp 2) 8 tokens 187.1 / 98.9 against 187.5 / 105.8, and lost
// at 16 (Mixtral 32 tokens 166.3 / 80.5 against 170.0 / 85.1). In the twentieth session, with the
// weights' early copies and the routing settled two launches back (the wgmma tiles read x in sorted
// order, quantized in its own launch), Mixtral-8x7B W4A8 decode, ms a step, wgmma / mma.sync, runs
// interleaved in one call: batch 1 3.34, 3.34 / 3.38, 3.40; batch 8 7.56, 7.55 / 7.89, 7.83 (bench/RESULTS.md).
constexpr int kMmaMaxTokenTiles = 0;
// Blocks an SM should hold for tiles of up to 16 rows, one and two consumer warpgroups (an experiment
// can build others: -DNIBBLE_MOE_BLOCKS_2G=3).
#ifndef NIBBLE_MOE_BLOCKS_1G
#define NIBBLE_MOE_BLOCKS_1G 4
#endif
#ifndef NIBBLE_MOE_BLOCKS_2G
#define NIBBLE_MOE_BLOCKS_2G 2
#endif
// Blocks an SM should hold for 64-row tiles of one consumer warpgroup (an experiment: -DNIBBLE_MOE_BLOCKS_1G_64=3).
#ifndef NIBBLE_MOE_BLOCKS_1G_64
#define NIBBLE_MOE_BLOCKS_1G_64 2
#endif
// Two consumer warpgroups take turns at the tensor cores: each issues a stage's chain only after the
// other has issued its own (a build define, -DNIBBLE_MOE_TURNS=0 for an A/B). Measured on an H200
// (bench/RESULTS.md, twenty-third session, the layer graph-replayed, µs without / with): Mixtral 32
// tokens 209.2 / 207.9, 128 357.3 / 354.1, 256 514.7 / 506.2, 1024 1378.7 / 1349.4; Grok-1 tp 2 256
// 834.7 / 813.0, 1024 2175.3 / 2154.8. It was a launch argument then, and the branch on it made ptxas
// serialize the wgmmas of the two-group tiles of 8 to 32 rows (C7520: a `WARPGROUP.DEPBAR` after each
// QGMMA; Mixtral's and Grok-1's gate_up at 17 to 32 tokens); a constant keeps their chains asynchronous.
// The 64-row tiles' early sums (below, kEarlySums: 32 registers a consumer thread through a chunk's
// last stage); an experiment builds them without (-DNIBBLE_MOE_EARLY_SUMS_64=0), e.g. for three blocks an SM.
#ifndef NIBBLE_MOE_EARLY_SUMS_64
#define NIBBLE_MOE_EARLY_SUMS_64 1
#endif
// The 64-row tiles' narrow chains (below, kNarrow); an experiment builds them without
// (-DNIBBLE_MOE_NARROW_64=0: one chain width, fewer registers).
#ifndef NIBBLE_MOE_NARROW_64
#define NIBBLE_MOE_NARROW_64 1
#endif
#ifndef NIBBLE_MOE_TURNS
#define NIBBLE_MOE_TURNS 1
#endif
// Measured on real alt builds and removed (bench/RESULTS.md, forty-third session, an H100, the layer
// graph-replayed, Mixtral 8 / 32 / 256 tokens within 1% of the head): the write-out with one named
// barrier (the rows' sums and scales double-buffered by chunk parity) and with each thread's two weight
// scales loaded once before its stores (today reloaded after each store, which may alias them).
// A timing experiment (wrong results): the consumers skip each chunk's write-out, their sums summed
// over the block's chunks (-DNIBBLE_MOE_LEAVE_OUT_WRITEOUT=1).
#ifndef NIBBLE_MOE_LEAVE_OUT_WRITEOUT
#define NIBBLE_MOE_LEAVE_OUT_WRITEOUT 0
#endif

// The lean producer: lane 0 of the producer warp alone, one `full` arrival a stage carrying all of its
// bytes, then the copies (rather than a lane a consumer warp's weights, whose bulk copies ptxas
// serializes in an ELECT loop, two __syncwarp and two barrier operations a stage). Where:
// NIBBLE_MOE_LEAN_PRODUCER 1 (default) the INT4 one-group 64-row tiles, 2 every wgmma tile, 0 none.
// Measured on an H100 (bench/RESULTS.md, forty-second session, the layer graph-replayed, µs, head /
// lean on every tile): Mixtral:128 361.4, 362.0, 360.9, 361.9 / 357.4, 358.8, 358.0, 358.2; Grok-1:128
// 578.2, 579.2, 578.6, 581.6 / 566.7, 570.3, 568.3, 570.1; DeepSeek-V3:1024 3012.3 / 2989.4; but
// Mixtral:256 (128-row tiles) 486.3, 484.3 / 521.9, 527.6 and Mixtral:1 80.0, 80.0 / 81.3, 81.3
// (Mixtral:32 and DeepSeek-V3:8 equal).
#ifndef NIBBLE_MOE_LEAN_PRODUCER
#define NIBBLE_MOE_LEAN_PRODUCER 1
#endif
// A timing experiment: -DNIBBLE_MOE_CLOCKS=1 has every warp count the SM cycles of its parts (the
// consumers' `full` waits, chains, write-outs and walk; the producer's `empty` waits), summed over the
// process's launches by tile rows and printed at exit (stderr): where a stage's cycles go in the real
// kernel, rather than in bench/probe_stage_rate.cu's model of it.
#ifndef NIBBLE_MOE_CLOCKS
#define NIBBLE_MOE_CLOCKS 0
#endif
// Consumer counters: the loop, its parts (the write-out split into its row sums, its two barriers and
// its stores; the walk into the cursor's advance and the loop's top), then stages and chunks written.
enum Clock : int { kClockLoop, kClockFull, kClockChain, kClockWoSums, kClockWoBarriers, kClockWriteout, kClockAdvance,
                   kClockWalk, kClockChunks, kClockStages, kProducerLoop, kProducerEmpty, kProducerStages, kClockWarps,
                   kClockCount };
__device__ unsigned long long moe_clocks[5][kClockCount];  // by log2 of the tile's 8-row tiles
// Adds `cycles` to counter `c` of the kernel's tile rows (lane 0 of the warp).
template <int kTokenTiles>
__device__ __forceinline__ void add_clock(int c, unsigned long long cycles) {
  constexpr int kIndex = kTokenTiles == 1 ? 0 : kTokenTiles == 2 ? 1 : kTokenTiles == 4 ? 2 : kTokenTiles == 8 ? 3 : 4;
  if (threadIdx.x % 32 == 0) atomicAdd(&moe_clocks[kIndex][c], cycles);
}

// The narrowest wgmma chain a chunk of `rows` live rows takes (GemmW4A8Args::narrow_chains): f is
// called with std::integral_constant<int, N> for the least multiple N of kStep that holds them (kMax at
// most). `rows` is the same in every lane. Below 128-row tiles the test is a warp vote, so that ptxas
// sees a uniform branch: with a plain comparison it serialized the 64-row tiles' wgmmas (C7520, a
// compiler-inserted warpgroup arrive in a divergent path); the 128-row tiles' comparison is the one
// measured (bench/RESULTS.md, twenty-fourth session).
template <int kMax, int kStep, int kN = kStep, typename F>
__device__ __forceinline__ void with_width(int rows, F&& f) {
  if constexpr (kN >= kMax)
    f(std::integral_constant<int, kMax>{});
  else if (kMax >= 128 ? rows <= kN : __all_sync(0xFFFFFFFFu, rows <= kN))
    f(std::integral_constant<int, kN>{});
  else
    with_width<kMax, kStep, kN + kStep>(rows, f);
}

int env_or(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

template <int kTokenTiles, bool kFp8, int kGroups, bool kMma>
struct Tile {
  static_assert(!kMma || (kGroups == 1 && !kFp8 && kTokenTiles <= 2), "mma.sync: INT4, one group, <= 16 rows");
  static constexpr int kWarps = 4 * kGroups;  // consumer warps: kGroups warpgroups of 64 output channels
  static constexpr int kConsumers = kWarps * 32;
  // One producer warp; for 128-row tiles (two consumer warpgroups holding 64 accumulators a thread) a
  // producer warpgroup, one warp of which copies, that hands registers to the consumers (the kernel).
  static constexpr bool kWide = kTokenTiles == 16;
  static_assert(!kWide || (kGroups == 2 && !kMma), "128-row tiles: two wgmma consumer warpgroups");
  static constexpr int kThreads = kConsumers + 32 * (kWide ? 4 : 1);
  static constexpr int kRows = kTokenTiles * 8;
  static constexpr int kLaneWords = kFp8 ? 2 : 1;               // uint4 a lane per K block
  static constexpr int kWarpBlockBytes = 32 * 16 * kLaneWords;  // a warp's 16 channels, one K block
  // Activations of a stage: for wgmma two halves of kRows rows × 128 bytes (K blocks 2h, 2h + 1),
  // 128-byte swizzled (a multiple of 1024 bytes: every slot and half stays 1024-byte aligned); for
  // mma.sync each row's K in a row of kActRowBytes (16 bytes of padding spread a lane's reads of 8
  // rows over the banks).
  static constexpr int kActRowBytes = kBlocksPerStage * kGemmKBlock + 16;
  static constexpr int kHalfBytes = kRows * 2 * kGemmKBlock;  // wgmma: one of a stage's two activation boxes
  static constexpr int kActSlotBytes = kMma ? kRows * kActRowBytes : 2 * kHalfBytes;
  static constexpr int kStageBytes = kBlocksPerStage * kWarps * kWarpBlockBytes + kActSlotBytes;
  // mma.sync: each warp's partial sums of the other warps' 16-channel tiles, (writer, tile, row tile, lane).
  static constexpr int kReduceSlots = kMma ? kWarps * kWarps * kTokenTiles * 32 : 1;
  // Blocks an SM should hold (registers permitting), and as many stages as their share of the SM's
  // shared memory allows.
  static constexpr int kMinBlocks = kGroups == 1 ? (kTokenTiles <= 2 ? NIBBLE_MOE_BLOCKS_1G : kTokenTiles == 4 ? 3 : NIBBLE_MOE_BLOCKS_1G_64)
                                                 : (kTokenTiles <= 2 ? NIBBLE_MOE_BLOCKS_2G : 1);
  static constexpr int kStages =
      std::clamp((220 * 1024 / kMinBlocks - 2048 - (kMma ? kReduceSlots * 16 : 0)) / kStageBytes, 3, 8);
};

// One stage: each warp's weight fragments for the stage's K blocks (one contiguous bulk copy a warp;
// a multiple of 1024 bytes, so that the activations after them stay 1024-byte aligned in the block's
// aligned shared memory), and the activations.
template <int kTokenTiles, bool kFp8, int kGroups, bool kMma>
struct alignas(128) GemmSmem {
  using T = Tile<kTokenTiles, kFp8, kGroups, kMma>;
  static_assert(sizeof(uint4) * T::kWarps * kBlocksPerStage * 32 * T::kLaneWords % 1024 == 0);
  uint4 weights[T::kStages][T::kWarps][kBlocksPerStage][32 * T::kLaneWords];
  uint8_t act[T::kStages][T::kActSlotBytes];
  uint64_t full[T::kStages];   // a slot's weights and activations have landed
  uint64_t empty[T::kStages];  // the consumers are done with a slot
  float token_sum[T::kRows];
  float token_scale[T::kRows];
  float4 reduce[T::kReduceSlots];
};

// The dynamic shared memory a block asks for: the layout, and (wgmma: swizzled activations) room to
// align it to 1024 bytes.
template <int kTokenTiles, bool kFp8, int kGroups, bool kMma>
constexpr int kSmemBytes = sizeof(GemmSmem<kTokenTiles, kFp8, kGroups, kMma>) + (kMma ? 0 : 1024);

// The activations' tensor map of the wgmma tiles; the mma.sync tiles copy rows and take none.
struct NoTensorMap {};
template <bool kMma>
using ActMap = std::conditional_t<kMma, NoTensorMap, CUtensorMap>;

// A position in a block's walk over its units: unit, row chunk of the unit's expert, pipeline stage.
struct Cursor {
  int unit;
  int chunk, stage;
  // Resolved from unit:
  int expert, row_begin, rows, group, split, chunks, stages, kb_begin, kb_count;
};

struct Walk {
  int units, groups, splits, kblocks, per_split, rows_per_chunk;

  __device__ void resolve(Cursor& c, const GemmW4A8Args& p) const {
    c.chunk = c.stage = 0;
    if (c.unit >= units) return;
    const int slot = c.unit / (groups * splits), rest = c.unit % (groups * splits);
    c.group = rest / splits;
    c.split = rest % splits;
    c.expert = __ldcg(p.active_experts + slot);  // through L2: possibly read before the grid dependency wait
    c.row_begin = __ldcg(p.expert_offsets + c.expert);
    c.rows = __ldcg(p.expert_offsets + c.expert + 1) - c.row_begin;
    c.chunks = (c.rows + rows_per_chunk - 1) / rows_per_chunk;
    c.kb_begin = c.split * per_split;
    c.kb_count = min(kblocks, c.kb_begin + per_split) - c.kb_begin;
    c.stages = (c.kb_count + kBlocksPerStage - 1) / kBlocksPerStage;
  }
  __device__ void advance(Cursor& c, const GemmW4A8Args& p) const {
    if (++c.stage < c.stages) return;
    c.stage = 0;
    if (++c.chunk < c.chunks) return;
    c.unit += gridDim.x;
    resolve(c, p);
  }
  __device__ bool valid(const Cursor& c) const { return c.unit < units; }
};

// Warp-specialized: the first kWarps warps (kGroups warpgroups) compute, the last one loads. The
// producer walks the block's
// stages ahead of the consumers, as far as the free slots allow: per stage it waits for the slot to be
// empty, starts one bulk copy of each consumer warp's weights and its lanes' 16-byte activation copies,
// all completing on the slot's `full` barrier; the consumers wait for `full`, compute, and release the
// slot on `empty`. Neither side waits for the other's global loads (a unit's expert and row lookups).
template <int kTokenTiles, bool kFp8, int kGroups, bool kMma>
__global__ void __launch_bounds__(Tile<kTokenTiles, kFp8, kGroups, kMma>::kThreads,
                                  Tile<kTokenTiles, kFp8, kGroups, kMma>::kMinBlocks)
    moe_gemm_w4a8_kernel(const __grid_constant__ GemmW4A8Args p, const __grid_constant__ ActMap<kMma> act_map) {
  using T = Tile<kTokenTiles, kFp8, kGroups, kMma>;
  constexpr int kRows = T::kRows, kStages = T::kStages, kWarps = T::kWarps, kConsumers = T::kConsumers;
  // f32 accumulator registers a thread: an m64 × kRows wgmma tile, or mma.sync's 4 channel tiles ×
  // kTokenTiles row tiles × 4.
  constexpr int kAcc = kMma ? kWarps * kTokenTiles * 4 : kRows / 2;
  extern __shared__ uint4 smem_raw[];
  const uint32_t misalign = kMma ? 0 : ptx::smem_address(smem_raw) & 1023;
  auto& sm = *reinterpret_cast<GemmSmem<kTokenTiles, kFp8, kGroups, kMma>*>(
      reinterpret_cast<uint8_t*>(smem_raw) + ((1024 - misalign) & 1023));

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;
  const int tiles = static_cast<int>(p.n / 16);
  // The routing and the activations come from the kernels before (launch.h); settled routing may be
  // read before the wait (GemmW4A8Args::routing_settled), and then each role waits below.
  if (!p.routing_settled) ptx::grid_dependency_wait();
  Walk walk;
  walk.groups = (tiles + kWarps - 1) / kWarps;
  walk.splits = static_cast<int>(p.splits);
  walk.kblocks = static_cast<int>(p.k / kGemmKBlock);
  walk.per_split = (walk.kblocks + walk.splits - 1) / walk.splits;
  walk.units = __ldcg(p.active_experts + p.num_experts) * walk.groups * walk.splits;
  walk.rows_per_chunk = kRows;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&sm.full[s], 1);  // the producer's arrival with its expected bytes
      ptx::mbarrier_init(&sm.empty[s], kMma ? kConsumers : kWarps);  // mma.sync: every lane arrives
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  // The weights of tile `tile` of a cursor's expert from K block kb.
  auto weights_at = [&](const Cursor& c, int tile, int kb) {
    return static_cast<const uint8_t*>(p.weights) +
           ((static_cast<int64_t>(c.expert) * tiles + tile) * walk.kblocks + kb) * T::kWarpBlockBytes;
  };

  // The producer's weight copies of a cursor's stage into `slot`, one bulk copy a consumer warp's tile;
  // the slot's `full` barrier expects their bytes (its producer arrival comes with the activations).
  auto copy_weights = [&](const Cursor& c, int slot) {
    const int first = c.kb_begin + c.stage * kBlocksPerStage;
    const int nkb = min(kBlocksPerStage, c.kb_begin + c.kb_count - first);
    const int valid_tiles = (p.leave_out & kWeights) ? 0 : min(kWarps, tiles - c.group * kWarps);
    const auto bytes = static_cast<uint32_t>(nkb * T::kWarpBlockBytes);
    if (lane == 0) ptx::mbarrier_expect_tx(&sm.full[slot], bytes * valid_tiles);
    __syncwarp();
    if (lane < valid_tiles) {
      const uint8_t* src = weights_at(c, c.group * kWarps + lane, first);
      if (p.evict_first)
        ptx::bulk_copy_to_shared_evict_first(sm.weights[slot][lane], src, bytes, &sm.full[slot]);
      else
        ptx::bulk_copy_to_shared(sm.weights[slot][lane], src, bytes, &sm.full[slot]);
    }
  };

  // Lanes below kWarps ask L2 for the weights of a cursor's stage, a consumer warp's tile each.
  auto prefetch_weights = [&](const Cursor& c) {
    if (lane < kWarps && c.group * kWarps + lane < tiles) {
      const int first = c.kb_begin + c.stage * kBlocksPerStage;
      const int nkb = min(kBlocksPerStage, c.kb_begin + c.kb_count - first);
      ptx::prefetch_l2_bulk(weights_at(c, c.group * kWarps + lane, first),
                            static_cast<uint32_t>(nkb * T::kWarpBlockBytes));
    }
  };

  // 128-row tiles: at launch each of the 384 threads has 168 registers (65536 over 12 warps' slots);
  // then the producer warpgroup keeps kProducerRegs and the consumers take kConsumerRegs
  // (256 · 224 + 128 · 56 = 168 · 384).
  [[maybe_unused]] constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  if (warp >= kWarps) {  // the producer
    if constexpr (T::kWide) {
      ptx::warpgroup_registers_decrease<kProducerRegs>();
      if (warp > kWarps) return;
    }
    // The block's first unit, resolved once (its lookups go to L2: each costs the pipeline's start).
    Cursor start{.unit = static_cast<int>(blockIdx.x)};
    walk.resolve(start, p);
    // Settled routing: the first stages' weights are asked for while the kernel before finishes, into
    // the slots and then into L2.
    int early = 0;
    if (p.routing_settled) {
      Cursor c = start;
      for (; early < kStages && walk.valid(c); ++early, walk.advance(c, p)) copy_weights(c, early);
      for (int s = 0; s < p.early_l2_stages && walk.valid(c); ++s, walk.advance(c, p)) prefetch_weights(c);
      ptx::grid_dependency_wait();
    }
    ptx::launch_dependents();
    // The kernel before wrote the activations with generic stores; the bulk copies read them through
    // the async proxy.
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    const int prefetch = p.prefetch_stages;
    Cursor load = start, ahead = start;
    // L2 is asked for the weights of `ahead`'s stage, then `ahead` moves on.
    auto prefetch_next = [&] {
      prefetch_weights(ahead);
      walk.advance(ahead, p);
    };
    for (int s = 0; prefetch > 0 && s < kStages + prefetch && walk.valid(ahead); ++s) prefetch_next();
    if constexpr (kMma) {
      // Bulk copies only: lanes below kWarps copy a 16-channel tile's weights, lanes below the chunk's
      // rows their row's activations (no zero fill: the consumers skip K blocks past the split, and a
      // row past the expert's only feeds its own output column, never written).
      const uint8_t* row_src = nullptr;
      int chunk_rows = 0;
      for (int step = 0; walk.valid(load); ++step) {
        const int slot = step % kStages;
        if (step >= kStages) ptx::mbarrier_wait(&sm.empty[slot], ((step / kStages) - 1) & 1);
        if (load.stage == 0) {
          const int r = load.chunk * kRows + lane;
          const int64_t pos = load.row_begin + r;
          chunk_rows = min(kRows, load.rows - load.chunk * kRows);
          row_src = lane < chunk_rows ? p.act + (p.act_row ? p.act_row[pos] : pos) * p.k : nullptr;
        }
        const int first = load.kb_begin + load.stage * kBlocksPerStage;
        const int nkb = min(kBlocksPerStage, load.kb_begin + load.kb_count - first);
        const int act_rows = (p.leave_out & kActivations) ? 0 : chunk_rows;
        const auto abytes = static_cast<uint32_t>(nkb * kGemmKBlock);
        if (step >= early) copy_weights(load, slot);
        if (lane == 0) ptx::mbarrier_arrive_expect_tx(&sm.full[slot], abytes * act_rows);
        __syncwarp();
        if (lane < act_rows)
          ptx::bulk_copy_to_shared(&sm.act[slot][lane * T::kActRowBytes], row_src + first * kGemmKBlock, abytes,
                                   &sm.full[slot]);
        walk.advance(load, p);
        if (prefetch > 0 && walk.valid(ahead)) prefetch_next();
      }
    } else {
      // Two boxes of the tensor map a stage (K blocks 0-1 and 2-3; zeros past K), the chunk's rows in
      // sorted order: rows past the expert's belong to the next expert and only feed their own output
      // rows, which are not written; rows past the tensor read as zeros.
      const bool acts = !(p.leave_out & kActivations);
      constexpr bool kLeanProducer =
          NIBBLE_MOE_LEAN_PRODUCER >= 2 || (NIBBLE_MOE_LEAN_PRODUCER == 1 && kTokenTiles == 8 && !kFp8 && kGroups == 1);
      if (kLeanProducer && prefetch == 0) {
        // Lane 0 alone: one arrival a stage with all of its bytes, then the copies.
        if (lane != 0) return;
        const bool weights = !(p.leave_out & kWeights);
        for (int step = 0; walk.valid(load); ++step) {
          const int slot = step % kStages;
          if (step >= kStages) ptx::mbarrier_wait(&sm.empty[slot], ((step / kStages) - 1) & 1);
          const int first = load.kb_begin + load.stage * kBlocksPerStage;
          const int nkb = min(kBlocksPerStage, load.kb_begin + load.kb_count - first);
          const int tiles_now = step >= early && weights ? min(kWarps, tiles - load.group * kWarps) : 0;
          const auto bytes = static_cast<uint32_t>(nkb * T::kWarpBlockBytes);
          ptx::mbarrier_arrive_expect_tx(&sm.full[slot], bytes * tiles_now + (acts ? T::kActSlotBytes : 0));
          const uint8_t* src = weights_at(load, load.group * kWarps, first);
          for (int t = 0; t < tiles_now; ++t) {
            const uint8_t* tile_src = src + static_cast<int64_t>(t) * walk.kblocks * T::kWarpBlockBytes;
            if (p.evict_first)
              ptx::bulk_copy_to_shared_evict_first(sm.weights[slot][t], tile_src, bytes, &sm.full[slot]);
            else
              ptx::bulk_copy_to_shared(sm.weights[slot][t], tile_src, bytes, &sm.full[slot]);
          }
          const int x = first * kGemmKBlock;
          const int y = load.row_begin + load.chunk * kRows;
          for (int h = 0; acts && h < 2; ++h)
            ptx::tensor_copy_2d_to_shared(&sm.act[slot][h * T::kHalfBytes], &act_map, x + h * 128, y, &sm.full[slot]);
          walk.advance(load, p);
        }
        return;
      }
      [[maybe_unused]] uint32_t clock_begin = 0, clock_empty = 0;
      if constexpr (NIBBLE_MOE_CLOCKS) clock_begin = clock();
      int step = 0;
      for (; walk.valid(load); ++step) {
        const int slot = step % kStages;
        if constexpr (NIBBLE_MOE_CLOCKS) {
          const uint32_t t = clock();
          if (step >= kStages) ptx::mbarrier_wait(&sm.empty[slot], ((step / kStages) - 1) & 1);
          clock_empty += static_cast<uint32_t>(clock()) - t;
        } else {
          if (step >= kStages) ptx::mbarrier_wait(&sm.empty[slot], ((step / kStages) - 1) & 1);
        }
        if (step >= early) copy_weights(load, slot);
        if (lane == 0) {
          ptx::mbarrier_arrive_expect_tx(&sm.full[slot], acts ? T::kActSlotBytes : 0);
          const int x = (load.kb_begin + load.stage * kBlocksPerStage) * kGemmKBlock;
          const int y = load.row_begin + load.chunk * kRows;
          for (int h = 0; acts && h < 2; ++h)
            ptx::tensor_copy_2d_to_shared(&sm.act[slot][h * T::kHalfBytes], &act_map, x + h * 128, y,
                                          &sm.full[slot]);
        }
        __syncwarp();
        walk.advance(load, p);
        if (prefetch > 0 && walk.valid(ahead)) prefetch_next();
      }
      if constexpr (NIBBLE_MOE_CLOCKS) {
        add_clock<kTokenTiles>(kProducerLoop, static_cast<uint32_t>(clock()) - clock_begin);
        add_clock<kTokenTiles>(kProducerEmpty, clock_empty);
        add_clock<kTokenTiles>(kProducerStages, step);
      }
    }
    return;
  }

  // The consumers.
  if constexpr (T::kWide) ptx::warpgroup_registers_increase<kConsumerRegs>();
  if (p.routing_settled) ptx::grid_dependency_wait();
  ptx::launch_dependents();
  Cursor compute{.unit = static_cast<int>(blockIdx.x)};
  walk.resolve(compute, p);
  float acc[kAcc] = {};
  [[maybe_unused]] const uint64_t act_desc = wgmma::descriptor_sw128(&sm.act[0][0]);
  [[maybe_unused]] const auto act_desc_lo = static_cast<uint32_t>(act_desc);
  [[maybe_unused]] const uint64_t act_desc_hi = act_desc & 0xFFFFFFFF00000000ull;  // swizzle, 8-row stride
  // The epilogue's rows: kThreadsPerRow consumers a row of the chunk, each summing every
  // kThreadsPerRow-th K block's Σ a.
  constexpr int kThreadsPerRow = kConsumers / kRows;
  const int rr = threadIdx.x / kThreadsPerRow, rpart = threadIdx.x % kThreadsPerRow;
  // Tiles of 64 and 128 rows ask for the first kEarlySums of those (64 K blocks in all: Mixtral's
  // gate_up whole) and the row's scale as the chunk's last stage starts, so that the loads run under
  // its wait and math: summed after it, they stalled about a tenth of the 128-row tiles' samples (ncu
  // source, Mixtral 1024 tokens). Measured on an H200 (bench/RESULTS.md, 2026-11-30), ncu µs of
  // gate_up / down without and with: Mixtral 128 tokens 225.6 / 115.8 against 220.3 / 111.5; 16-row
  // tiles lost (Mixtral 32 tokens 136.5 / 67.3 against 138.9 / 68.5; the engine at batch 32 9.52
  // against 9.80 ms a step), and keep their sums for the epilogue.
  constexpr int kEarlySums = kMma || kFp8 || kRows < 64 || (kRows == 64 && !NIBBLE_MOE_EARLY_SUMS_64) ? 0 : 64 / kThreadsPerRow;
  [[maybe_unused]] float early_sums[kEarlySums > 0 ? kEarlySums : 1];
  [[maybe_unused]] float early_scale = 0.0f;
  auto act_row_of = [&](const Cursor& c) -> int64_t {
    const int r = c.chunk * kRows + rr;
    const int64_t pos = c.row_begin + r;
    return r < c.rows ? (p.act_row ? __ldg(p.act_row + pos) : pos) : -1;
  };
  // The step's slot and the parity of its phase, its `full` barrier waited for and its `empty` one
  // arrived on: the slot and parity kept as counters and the barriers' shared addresses in registers
  // (through a shuffle from lane 0: ptxas otherwise rebuilds them from the shared window every stage),
  // and the wgmma descriptors' slot field likewise through a shuffle, which ptxas then keeps in uniform
  // registers (one R2UR and seven UIADD3 a stage rather than sixteen R2UR and their moves). cuobjdump:
  // 133 SASS instructions from the loop head to the wgmma wait for Mixtral's batch-32 gate_up tile,
  // against 143 with both recomputed from the step every stage. Measured with ptx.cuh's suspend hint,
  // one call, runs interleaved, Mixtral-8x7B W4A8 ms a step (bench/RESULTS.md, twenty-first session):
  // batch 1 3.34, 3.34 against 3.37, 3.40; batch 8 7.54 against 7.61; batch 32 9.47, 9.53 against 9.53,
  // 9.66; Grok-1 shaped as one rank of tp 2, batch 32, 27.08 against 27.36.
  // Two consumer warpgroups take turns at the tensor cores (NIBBLE_MOE_TURNS, above): each issues a stage's
  // chain only after the other has issued its own, so that one group's chain runs while the other waits
  // for its last, adds it to its sums and readies its next operands. Named barrier 2 + w holds
  // warpgroup w until the other has issued; group 1 lets group 0 go first, and group 0 takes group 1's
  // last arrival after the walk.
  constexpr bool turns = kGroups == 2 && !kMma && NIBBLE_MOE_TURNS;
  const int group_in_block = warp / 4;
  if (turns && group_in_block == 1) ptx::named_barrier_arrive(2, kConsumers);
  const uint32_t full0 = __shfl_sync(0xFFFFFFFFu, ptx::smem_address(&sm.full[0]), 0);
  const uint32_t empty0 = __shfl_sync(0xFFFFFFFFu, ptx::smem_address(&sm.empty[0]), 0);
  int slot = kStages - 1;
  uint32_t parity = 1;
  // The chain's sums go into acc with an add and acc is zeroed after the chunk's write-out; ptxas then
  // adds a stage's sums into new registers and moves them back (48 of the 64-row tiles' 275
  // instructions a stage). Resetting acc by an FMA at a chunk's first stage instead (acc · 0 + d) kept
  // them in place but would carry a NaN row into the block's next chunks; its A/B (thirty-seventh
  // session) timed the default build against itself (bench/RESULTS.md, forty-first session), so it is
  // unmeasured.
  [[maybe_unused]] uint32_t clocks[kClockStages + 1] = {};
  [[maybe_unused]] uint32_t clock_mark = 0;
  // Cycles since the last mark into counter c (NIBBLE_MOE_CLOCKS).
  [[maybe_unused]] auto tick = [&](int c) {
    if constexpr (NIBBLE_MOE_CLOCKS) {
      const uint32_t t = clock();
      clocks[c] += t - clock_mark;
      clock_mark = t;
    }
  };
  // A chunk's write-out once its last stage is summed in acc (acc zeroed after): its rows' Σ a over the
  // split's K blocks (INT4's offset correction; the first kEarlySums of them loaded early, in the
  // chunk's last stage) and scales, then the tile's outputs.
  auto write_out = [&](const Cursor& c) {
    // Each row's Σ a over this split's K blocks (INT4's offset correction) and its scale.
    const int64_t act_row = act_row_of(c);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kEarlySums; ++i) sum += early_sums[i];
    if (!kFp8 && act_row >= 0) {
      const float* sums = p.act_sums + act_row * walk.kblocks + c.kb_begin;
#pragma unroll(kMma ? 4 : 8)
      for (int kb = rpart + kEarlySums * kThreadsPerRow; kb < c.kb_count; kb += kThreadsPerRow)
        sum += sums[kb];
    }
#pragma unroll
    for (int o = kThreadsPerRow / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
    tick(kClockWoSums);
    ptx::named_barrier_sync(1, kConsumers);  // every consumer is done with the previous chunk's rows
    if (rpart == 0) {
      sm.token_sum[rr] = sum;
      sm.token_scale[rr] = kEarlySums > 0 ? early_scale : act_row >= 0 ? p.act_scale[act_row] : 0.0f;
    }
    if constexpr (kMma) {  // the partial sums of the other warps' channel tiles
#pragma unroll
      for (int mt = 0; mt < kWarps; ++mt)
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt) {
          const float* d = &acc[(mt * kTokenTiles + nt) * 4];
          if (mt != warp) sm.reduce[((warp * kWarps + mt) * kTokenTiles + nt) * 32 + lane] = {d[0], d[1], d[2], d[3]};
        }
    }
    ptx::named_barrier_sync(1, kConsumers);
    tick(kClockWoBarriers);
    if constexpr (NIBBLE_MOE_CLOCKS) ++clocks[kClockChunks];
    const int tile = c.group * kWarps + warp;
    if (kMma && tile < tiles) {
      // This warp's tile summed over the four warps' K blocks. Accumulator j of row tile nt: channel
      // g (j < 2) or g + 8, row 8·nt + 2q + j % 2.
      float sum[kTokenTiles][4];
#pragma unroll
      for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float v = 0.0f;
#pragma unroll
          for (int mt = 0; mt < kWarps; ++mt)
            if (mt == warp) v = acc[(mt * kTokenTiles + nt) * 4 + j];
          sum[nt][j] = v;
        }
#pragma unroll
      for (int other = 0; other < kWarps; ++other) {
        if (other == warp) continue;
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt) {
          const float4 r = sm.reduce[((other * kWarps + warp) * kTokenTiles + nt) * 32 + lane];
          sum[nt][0] += r.x, sum[nt][1] += r.y, sum[nt][2] += r.z, sum[nt][3] += r.w;
        }
      }
      const float* wscale = p.weight_scale + static_cast<int64_t>(c.expert) * p.n;
      float* out = p.out + (c.split * p.max_rows + c.row_begin + c.chunk * kRows) * p.n;
#pragma unroll
      for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int row = nt * 8 + 2 * q + (j & 1);
          const int64_t channel = tile * 16 + g + ((j & 2) ? 8 : 0);
          if (c.chunk * kRows + row >= c.rows) continue;
          const float dot =
              sum[nt][j] * ((j & 2) ? int4_f16::kHighScale : int4_f16::kLowScale) - 8.0f * sm.token_sum[row];
          out[row * p.n + channel] = dot * sm.token_scale[row] * wscale[channel];
        }
    }
    // The wgmma tiles' rows out. Accumulator j: row group j / 4 of 8 rows; channels g (j % 4 < 2) or
    // g + 8; row 2q + j % 2.
    const float* wscale = p.weight_scale + static_cast<int64_t>(c.expert) * p.n;
    const int64_t first_row = c.row_begin + c.chunk * kRows;
    auto value = [&](int j, int row, int64_t channel) {
      const float dot = kFp8 ? acc[j] : acc[j] * 512.0f - 8.0f * sm.token_sum[row];
      return dot * sm.token_scale[row] * wscale[channel];
    };
    if (!kMma && tile < tiles) {
      if (p.glu) {
        // Rows g of the tile are gate channels, g + 8 the up ones of the same channels (kGluRows):
        // the values written as the unfused epilogue writes them, then act(0 + gate) · (0 + up) as
        // the activation kernels compute them. With glu_amax, each row's amax over the warp's 8
        // channels (the 8 lanes of one q share their rows) stored by lanes 0-3.
        float* out = p.out + first_row * (p.n / 2);
        const int64_t c16 = tile * 16 + g;
#pragma unroll
        for (int j = 0; j < kAcc; ++j) {
          if (j & 2) continue;
          const int row = (j / 4) * 8 + 2 * q + (j & 1);
          const bool live = c.chunk * kRows + row < c.rows;
          const float gate = value(j, row, c16), up = value(j + 2, row, c16 + 8);
          const float h = activate(p.glu_activation, 0.0f + gate) * (0.0f + up);
          if (live) out[row * (p.n / 2) + tile * 8 + g] = h;
          // Tiles of 8 and 16 rows only (moe_gemm_w4a8_fuses_glu): in the 128-row kernel the shuffles
          // made ptxas serialize the wgmmas (C7520).
          if (kTokenTiles <= 2 && p.glu_amax != nullptr) {  // the same for the whole grid
            float m = live ? fmaxf(0.0f, fabsf(h)) : 0.0f;  // NaN left out, as the activation kernels' max
#pragma unroll
            for (int o = 4; o < 32; o *= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
            if (g == 0 && live) p.glu_amax[(first_row + row) * (p.n / 16) + tile] = m;
          }
        }
      } else {
        float* out = p.out + (c.split * p.max_rows + first_row) * p.n;
#pragma unroll
        for (int j = 0; j < kAcc; ++j) {
          const int row = (j / 4) * 8 + 2 * q + (j & 1);
          const int64_t channel = tile * 16 + g + ((j & 2) ? 8 : 0);
          if (c.chunk * kRows + row >= c.rows) continue;
          out[row * p.n + channel] = value(j, row, channel);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kAcc; ++j) acc[j] = 0.0f;
    tick(kClockWriteout);
  };
  if constexpr (NIBBLE_MOE_CLOCKS) clock_mark = clocks[kClockLoop] = clock();
  while (walk.valid(compute)) {
    if (++slot == kStages) slot = 0, parity ^= 1;
    auto wait_full = [&] { ptx::mbarrier_wait_at(full0 + 8 * slot, parity); };
    auto release = [&] { ptx::mbarrier_arrive_at(empty0 + 8 * slot); };
    if constexpr (kEarlySums > 0) {
      if (compute.stage == compute.stages - 1) {
        const int64_t act_row = act_row_of(compute);
        const float* sums = p.act_sums + (act_row >= 0 ? act_row : 0) * walk.kblocks + compute.kb_begin;
#pragma unroll
        for (int i = 0; i < kEarlySums; ++i) {
          const int kb = rpart + i * kThreadsPerRow;
          early_sums[i] = act_row >= 0 && kb < compute.kb_count ? __ldg(sums + kb) : 0.0f;
        }
        early_scale = act_row >= 0 ? __ldg(p.act_scale + act_row) : 0.0f;
      }
    }
    tick(kClockWalk);  // the early sums' loads count as the walk's
    wait_full();
    tick(kClockFull);

    const int first = compute.kb_begin + compute.stage * kBlocksPerStage;
    const int nkb = min(kBlocksPerStage, compute.kb_begin + compute.kb_count - first);
    constexpr bool kMathBranch = NIBBLE_MOE_LEAVE_OUT_MATH || kMma || kFp8 || kRows != 64;
    if (kMathBranch && (p.leave_out & kMath)) {
      if (kMma || lane == 0) release();
      walk.advance(compute, p);
      continue;
    }
    if constexpr (kMma) {
      // This warp's K block of the stage (warp b takes block b), all four 16-channel tiles: the weights
      // and the live row tiles' activations to registers, the slot handed back, then the math.
      const int b = warp, rows_left = compute.rows - compute.chunk * kRows;
      if (b < nkb) {
        uint4 w[kWarps];
#pragma unroll
        for (int mt = 0; mt < kWarps; ++mt) w[mt] = sm.weights[slot][mt][b][lane];
        // Lane (g, q) reads K 4q..4q+3 of row g of each 16-wide K step: physical K 4q, 4q+2 are its
        // logical 2q, 2q+1 (b0) and 4q+1, 4q+3 its 2q+8, 2q+9 (b1), as in the weights below.
        uint32_t x[kTokenTiles][4];
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt)
#pragma unroll
          for (int s = 0; s < 4; ++s)
            x[nt][s] = nt * 8 < rows_left ? *reinterpret_cast<const uint32_t*>(
                                                &sm.act[slot][(nt * 8 + g) * T::kActRowBytes + b * kGemmKBlock +
                                                              s * 16 + 4 * q])
                                          : 0u;
        release();  // this lane is done reading the slot
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t bf[kTokenTiles][2];
#pragma unroll
          for (int nt = 0; nt < kTokenTiles; ++nt) int4_f16::activation_fragment(x[nt][s], bf[nt]);
#pragma unroll
          for (int mt = 0; mt < kWarps; ++mt) {
            uint32_t a[4];  // int4_f16_mma.cuh: the nibbles as f16, rows g + 8 scaled by 16
            int4_f16::weight_fragment(s == 0 ? w[mt].x : s == 1 ? w[mt].y : s == 2 ? w[mt].z : w[mt].w, a);
#pragma unroll
            for (int nt = 0; nt < kTokenTiles; ++nt)
              if (nt == 0 || nt * 8 < rows_left) {
                float(&d)[4] = *reinterpret_cast<float(*)[4]>(&acc[(mt * kTokenTiles + nt) * 4]);
                int4_f16::mma(d, a, bf[nt]);
              }
          }
        }
      } else {
        release();
      }
    } else {
    // The stage's four K blocks in one chain of tensor-core sums (256 K), then added to the fp32 sums.
    // Every wgmma is issued (a branch around one makes ptxas serialize them all); a K block past the
    // split's end has zero weights here (its activations are the next split's, or zeros past K: finite
    // FP8 codes either way, so its products are zero).
    uint32_t a[kBlocksPerStage][2][4];
#pragma unroll
    for (int b = 0; b < kBlocksPerStage; ++b) {
      const uint32_t live = b < nkb ? 0xFFFFFFFFu : 0u;
      if constexpr (kFp8) {  // the two K steps' A fragments, as stored
        const uint4 lo = sm.weights[slot][warp][b][2 * lane], hi = sm.weights[slot][warp][b][2 * lane + 1];
        a[b][0][0] = lo.x & live, a[b][0][1] = lo.y & live, a[b][0][2] = lo.z & live, a[b][0][3] = lo.w & live;
        a[b][1][0] = hi.x & live, a[b][1][1] = hi.y & live, a[b][1][2] = hi.z & live, a[b][1][3] = hi.w & live;
      } else {
        // Each nibble u becomes the FP8 byte u, worth u · 2^-9: low nibbles are rows g, high g + 8.
        const uint32_t m = 0x0F0F0F0Fu & live;
        const uint4 w = sm.weights[slot][warp][b][lane];
        a[b][0][0] = w.x & m, a[b][0][1] = (w.x >> 4) & m;
        a[b][0][2] = w.y & m, a[b][0][3] = (w.y >> 4) & m;
        a[b][1][0] = w.z & m, a[b][1][1] = (w.z >> 4) & m;
        a[b][1][2] = w.w & m, a[b][1][3] = (w.w >> 4) & m;
      }
    }
    // The activations' descriptors: slot 0's address field moved to this slot, K block and K step
    // (addresses stay below 2^18, so the 14-bit field takes the sum without a carry); the upper word
    // is constant.
    const uint32_t slot_lo =  // uniform registers (above)
        __shfl_sync(0xFFFFFFFFu, act_desc_lo + static_cast<uint32_t>(slot * T::kActSlotBytes >> 4), 0);
    // One chain of m64 × N products, then added to the fp32 sums: N is `width` (128-row tiles: up to
    // n128, the tensor cores' best rate on A from registers), so that a partly filled chunk (an expert's
    // last, or one of fewer rows than the tile) costs the tensor cores only its rows. Accumulators past
    // N stay zero (a chunk's width is the same at every stage); rows past the chunk's are never
    // written.
    float d[kAcc];
    // ptxas puts a warpgroup.arrive before each wgmma of the 128-row tiles (C7519: nvcc sinks the nibble
    // masks between them). Keeping every A fragment in registers before the chain (an operand fence a
    // register, as CUTLASS's warpgroup_fence_operand) gave one arrive and eight QGMMA back to back, and
    // was slower: Mixtral 1024 tokens 1435.6 µs against 1378.7, Grok-1 tp 2 2284.7 against 2175.3
    // (bench/RESULTS.md, twenty-third session). So was A from shared memory with no weight loads at
    // all (a timing probe, since removed: 1369.9). On the INT4 64-row tiles the same fence is
    // unmeasured: its A/B (thirty-fourth session) timed the default build against itself
    // (bench/RESULTS.md, forty-first session).
    auto chain = [&](auto width) {
      constexpr int kN = decltype(width)::value;
      float(&dn)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&d[0]);
      if constexpr (turns) ptx::named_barrier_sync(2 + group_in_block, kConsumers);
      wgmma::fence();
#pragma unroll
      for (int b = 0; b < kBlocksPerStage; ++b) {
        // K block b: half b / 2, bytes 64 · (b % 2) of each 128-byte row; its second K step 32 bytes on.
        const uint32_t lo = slot_lo + static_cast<uint32_t>(((b / 2) * T::kHalfBytes + (b % 2) * 64) >> 4);
        wgmma::WgmmaE4m3<kN>::mma(dn, a[b][0], act_desc_hi | lo, b);
        wgmma::WgmmaE4m3<kN>::mma(dn, a[b][1], act_desc_hi | (lo + (32 >> 4)), 1);
      }
      wgmma::commit();
      if constexpr (turns) ptx::named_barrier_arrive(2 + (group_in_block ^ 1), kConsumers);
      wgmma::wait<0>();
#pragma unroll
      for (int j = 0; j < kN / 2; ++j) acc[j] += dn[j];
    };
    // The chain's width (tiles of 64 and 128 rows, with narrow chains): the narrowest multiple of 32
    // rows (the narrowest wgmma at the tensor cores' full rate, bench/probe_tensor_rate.cu) that holds
    // the chunk's live rows. Chosen around the chain alone: around all of a stage's code it tripled the
    // 128-row kernel's code and was 5% slower at Grok-1's 2048 tokens, where the chunks are full. The
    // 64-row tiles' width (n32 or n64, by a warp vote; ptxas puts a warpgroup arrive before each of
    // their wgmmas, C7519) measured on an H200 (bench/RESULTS.md, twenty-fifth session, the layer, µs
    // with / without, two rounds): Grok-1 tp 2 128 tokens 586.5, 583.3 / 617.2, 623.3; DeepSeek-V3
    // 1024 3195.5, 3197.9 / 3338.8, 3341.5; Mixtral 128 355.8, 352.6 / 358.9, 365.6; equal at 64, 256.
    constexpr bool kNarrow = kRows >= 64 && (kRows > 64 || NIBBLE_MOE_NARROW_64);
    const int live_rows = p.narrow_chains ? compute.rows - compute.chunk * kRows : kRows;
    with_width<kRows, (kNarrow ? 32 : kRows)>(live_rows, chain);
    if (lane == 0) release();  // this warp is done reading the slot
    }
    tick(kClockChain);
    if constexpr (NIBBLE_MOE_CLOCKS) ++clocks[kClockStages];

    if (!NIBBLE_MOE_LEAVE_OUT_WRITEOUT && compute.stage == compute.stages - 1)  // the chunk's last stage
      write_out(compute);
    walk.advance(compute, p);
    tick(kClockAdvance);
  }
  if constexpr (NIBBLE_MOE_CLOCKS) {
    clocks[kClockLoop] = clock() - clocks[kClockLoop];
    for (int c = kClockLoop; c <= kClockStages; ++c) add_clock<kTokenTiles>(c, clocks[c]);
    add_clock<kTokenTiles>(kClockWarps, 1);
  }
  if constexpr (NIBBLE_MOE_LEAVE_OUT_WRITEOUT) {  // the sums, summed over the block's chunks, stay live
    float keep = 0.0f;
#pragma unroll
    for (int j = 0; j < kAcc; ++j) keep += acc[j];
    if (keep == 12345.0f) p.out[threadIdx.x] = keep;
  }
  if (turns && group_in_block == 0) ptx::named_barrier_sync(2, kConsumers);
}

// Blocks of the <kTokenTiles, kFp8, kGroups, kMma> kernel an SM holds at once (the same on every
// device); the kernel's shared-memory limit set on the current device (kernel_attributes.h).
template <int kTokenTiles, bool kFp8, int kGroups, bool kMma>
int resident_blocks() {
  using T = Tile<kTokenTiles, kFp8, kGroups, kMma>;
  constexpr int kSmem = kSmemBytes<kTokenTiles, kFp8, kGroups, kMma>;
  auto* kernel = moe_gemm_w4a8_kernel<kTokenTiles, kFp8, kGroups, kMma>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem);
  static const int resident = [&] {
    int blocks = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, T::kThreads, kSmem));
    return std::max(blocks, 1);
  }();
  return resident;
}

// The grid that divides `units` as evenly as it can: every block walks the same number of units (but
// for the last), even if that leaves a few SM slots empty.
struct Grid {
  int64_t blocks, per_block;
};
Grid grid_for(int64_t units, int64_t slots) {
  const int64_t per_block = (units + slots - 1) / slots;
  return {(units + per_block - 1) / per_block, per_block};
}

// NIBBLE_MOE_CLOCKS: the counters, cycles a warp's stage by tile rows, to stderr (at exit).
void print_moe_clocks() {
  unsigned long long c[5][kClockCount];
  if (cudaMemcpyFromSymbol(c, moe_clocks, sizeof(c)) != cudaSuccess) {
    std::fprintf(stderr, "moe clocks: %s\n", cudaGetErrorString(cudaGetLastError()));
    return;
  }
  for (int i = 0; i < 5; ++i) {
    if (c[i][kClockStages] == 0) continue;
    const double stages = static_cast<double>(c[i][kClockStages]), produced = static_cast<double>(c[i][kProducerStages]);
    const double chunks = std::max(1.0, static_cast<double>(c[i][kClockChunks]));
    const double wo_sums = c[i][kClockWoSums], wo_bars = c[i][kClockWoBarriers], wo_stores = c[i][kClockWriteout];
    std::fprintf(stderr,
                 "moe clocks %3d-row tiles: %llu consumer warps, %.1f stages and %.1f chunks each; cycles a consumer "
                 "warp's stage: loop %.1f = full wait %.1f + chain %.1f + write-out %.1f + walk %.1f (advance %.1f); "
                 "a chunk's write-out %.1f = row sums %.1f + barriers %.1f + stores %.1f; producer (wgmma tiles' "
                 "warp loop; not the lean one): loop %.1f, empty wait %.1f a stage\n",
                 8 << i, c[i][kClockWarps], stages / static_cast<double>(c[i][kClockWarps]),
                 chunks / static_cast<double>(c[i][kClockWarps]), c[i][kClockLoop] / stages, c[i][kClockFull] / stages,
                 c[i][kClockChain] / stages, (wo_sums + wo_bars + wo_stores) / stages,
                 (c[i][kClockWalk] + c[i][kClockAdvance]) / stages, c[i][kClockAdvance] / stages,
                 (wo_sums + wo_bars + wo_stores) / chunks, wo_sums / chunks, wo_bars / chunks, wo_stores / chunks,
                 produced > 0 ? c[i][kProducerLoop] / produced : 0.0, produced > 0 ? c[i][kProducerEmpty] / produced : 0.0);
  }
}

// Once a process (one registration a kernel instantiation printed the counters once each).
void register_moe_clocks_print() {
  static const bool registered = std::atexit(print_moe_clocks) == 0;
  (void)registered;
}

template <int kTokenTiles, bool kFp8, int kGroups, bool kMma = false>
void launch(const GemmW4A8Args& p, cudaStream_t stream) {
  if constexpr (NIBBLE_MOE_CLOCKS) register_moe_clocks_print();
  using T = Tile<kTokenTiles, kFp8, kGroups, kMma>;
  constexpr int kSmem = kSmemBytes<kTokenTiles, kFp8, kGroups, kMma>;
  // The blocks an INT4 tile's stages were sized for fit an SM's 228 KB (each with 1 KB the system
  // keeps): else the occupancy below would hold fewer, and the weights in flight would shrink unseen.
  // (The FP8 16-row tiles take their least 3 stages and run 3 blocks an SM, not 4.)
  static_assert(kFp8 || T::kMinBlocks * (kSmem + 1024) <= 228 * 1024, "MoE GEMM tile: its stages do not fit its blocks");
  auto* kernel = moe_gemm_w4a8_kernel<kTokenTiles, kFp8, kGroups, kMma>;
  const int resident = resident_blocks<kTokenTiles, kFp8, kGroups, kMma>();
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem);  // a probe's kernel
  const int64_t groups = (p.n / 16 + T::kWarps - 1) / T::kWarps;
  const int64_t units = p.expert_slots * groups * p.splits;
  const auto grid = static_cast<unsigned>(grid_for(units, int64_t{multiprocessor_count()} * resident).blocks);
  static const int prefetch_stages = env_or("NIBBLE_MOE_PREFETCH_STAGES", kPrefetchStages);
  static const int early_l2_stages = env_or("NIBBLE_MOE_EARLY_L2_STAGES", kEarlyL2Stages);
  static const int leave_out = env_or("NIBBLE_MOE_LEAVE_OUT", kNothing);
  check(NIBBLE_MOE_LEAVE_OUT_MATH || !(leave_out & kMath),
        "NIBBLE_MOE_LEAVE_OUT=", leave_out, " leaves the math out: build with -DNIBBLE_MOE_LEAVE_OUT_MATH=1");
  // The weights are read once a step: their copies ask L2 to evict them first, so that they do not
  // push out what the step reads again (activations, the KV cache, the next kernels' inputs).
  // Measured on an H200 (bench/RESULTS.md, nineteenth session, Mixtral-8x7B W4A8 decode, ms a step,
  // evict first / normal): batch 1 3.35-3.39 / 3.42-3.44, batch 8 7.89-7.92 / 7.95, batch 32 equal.
  static const bool evict_first = env_or("NIBBLE_MOE_EVICT_FIRST", 1) != 0;
  // 128-row tiles multiply only a chunk's live rows (rounded up to 32) unless NIBBLE_MOE_NARROW_CHAINS=0.
  static const bool narrow_chains = env_or("NIBBLE_MOE_NARROW_CHAINS", 1) != 0;
  GemmW4A8Args args = p;
  args.prefetch_stages = prefetch_stages;
  args.early_l2_stages = early_l2_stages;
  args.leave_out = leave_out;
  args.evict_first = evict_first;
  args.narrow_chains = narrow_chains;
  // wgmma tiles: the activations in sorted order as a tensor map, boxes of a chunk's rows × 128 bytes.
  ActMap<kMma> act_map{};
  if constexpr (!kMma) {
    const uint8_t* sorted = p.act_row == nullptr ? p.act : p.act_sorted;
    check(sorted != nullptr, "moe_gemm_w4a8: the wgmma tiles read the activations in sorted order (act_sorted)");
    act_map = byte_matrix_map_sw128(sorted, p.max_rows, p.k, T::kRows);
  }
  launch_kernel(kernel, grid, T::kThreads, kSmem, stream, args, act_map);
}

// Rows of the average active expert decide the tile's rows, with room for twice the average (so
// that a busier than average expert still streams its weights once), up to NIBBLE_MOE_MAX_TILE_ROWS
// (128; an expert with more rows takes several chunks, its weights read again, mostly from L2).
int token_tiles_for(int64_t rows, int64_t expert_slots, int max_tile_rows = 0) {
  static const int fallback = env_or("NIBBLE_MOE_MAX_TILE_ROWS", kMaxTileRows);
  const bool wide = (max_tile_rows > 0 ? max_tile_rows : fallback) >= 128;
  const int64_t per_expert = (rows + expert_slots - 1) / std::max<int64_t>(1, expert_slots);
  return per_expert <= 4 ? 1 : per_expert <= 8 ? 2 : per_expert <= 16 ? 4 : per_expert <= 32 || !wide ? 8 : 16;
}

// Consumer warpgroups for a problem of N channels in tiles of `token_tiles` 8-row tiles (INT4 wgmma).
int consumer_groups(int64_t n, int token_tiles) {
  static const int forced = std::clamp(env_or("NIBBLE_MOE_CONSUMER_GROUPS", 0), 0, 2);
  if (forced > 0) return forced;
  return (token_tiles == 2 && n >= kTwoGroupsMinN) || token_tiles == 16 ? 2 : 1;
}

// NIBBLE_MOE_MATH: "mma" or "wgmma" (measurements: bench/RESULTS.md).
GemmMath gemm_math() {
  static const GemmMath math = [] {
    const std::string name = env_choice("NIBBLE_MOE_MATH", {"mma", "wgmma"});
    return name == "mma" ? GemmMath::kMmaSync : name == "wgmma" ? GemmMath::kWgmma : GemmMath::kDefault;
  }();
  return math;
}

// INT4 tiles of `token_tiles` 8-row tiles on mma.sync (else wgmma), `math` or else NIBBLE_MOE_MATH's.
bool takes_mma_sync(int token_tiles, GemmMath math) {
  if (token_tiles > 2) return false;
  if (math == GemmMath::kDefault) math = gemm_math();
  return math == GemmMath::kMmaSync || (math == GemmMath::kDefault && token_tiles <= kMmaMaxTokenTiles);
}

template <int kTokenTiles>
void launch_tiles(const GemmW4A8Args& p, cudaStream_t stream) {
  if constexpr (kTokenTiles == 16) {
    launch<16, false, 2>(p, stream);  // INT4 only (the dispatch), always two consumer warpgroups
  } else {
    if (p.weight_format == ExpertWeightFormat::kFp8) return launch<kTokenTiles, true, 1>(p, stream);
    if constexpr (kTokenTiles <= 2)
      if (takes_mma_sync(kTokenTiles, p.math)) return launch<kTokenTiles, false, 1, true>(p, stream);
    const int groups = p.consumer_groups > 0 ? p.consumer_groups : consumer_groups(p.n, kTokenTiles);
    if (groups == 2) return launch<kTokenTiles, false, 2>(p, stream);
    launch<kTokenTiles, false, 1>(p, stream);
  }
}

}  // namespace

int64_t choose_k_splits(int64_t n, int64_t k, int64_t expert_slots, int64_t rows, int num_sms) {
  const int64_t kblocks = k / kGemmKBlock;
  const int token_tiles = token_tiles_for(rows, expert_slots);
  const int64_t warps = 4 * consumer_groups(n, token_tiles);
  const int64_t pairs = expert_slots * ((n / 16 + warps - 1) / warps);  // (expert, a block's channels)
  static const int units_per_sm = env_or("NIBBLE_MOE_UNITS_PER_SM", kUnitsPerSm);
  const int64_t most = std::max<int64_t>(1, kblocks / kBlocksPerStage);
  auto no_empty_split = [&](int64_t splits) {
    const int64_t per_split = (kblocks + splits - 1) / splits;
    return (kblocks + per_split - 1) / per_split;
  };
  // 128-row tiles (one block an SM): as few splits as give the GPU kWideUnitsPerSm chunks an SM,
  // counting each expert's 128-row chunks (every split writes its F32 sums out for the combine);
  // NIBBLE_MOE_WIDE_UNITS_PER_SM overrides it, 0 the rule of the other tiles below.
  static const int wide_units_per_sm = env_or("NIBBLE_MOE_WIDE_UNITS_PER_SM", kWideUnitsPerSm);
  if (token_tiles == 16 && wide_units_per_sm > 0) {
    const int64_t per_expert = (rows + expert_slots - 1) / expert_slots;
    const int64_t chunks = pairs * ((per_expert + 127) / 128);
    const int64_t target = int64_t{num_sms} * wide_units_per_sm;
    return no_empty_split(std::clamp<int64_t>((target + chunks - 1) / chunks, 1, most));
  }
  static const int min_unit_stages = std::max(1, env_or("NIBBLE_MOE_MIN_UNIT_STAGES", kMinUnitStages));
  const int64_t long_units = std::max<int64_t>(kblocks / (kBlocksPerStage * min_unit_stages),
                                               (int64_t{num_sms} * kMinUnitsPerSm + pairs - 1) / pairs);
  const int64_t target = static_cast<int64_t>(num_sms) * units_per_sm;
  return no_empty_split(std::clamp<int64_t>(std::min((target + pairs - 1) / pairs, long_units), 1, most));
}

bool moe_gemm_w4a8_reads_sorted(ExpertWeightFormat format, int64_t rows, int64_t expert_slots) {
  return format == ExpertWeightFormat::kFp8 || !takes_mma_sync(token_tiles_for(rows, expert_slots), GemmMath::kDefault);
}

bool moe_gemm_w4a8_fuses_glu(ExpertWeightFormat format, int64_t rows, int64_t expert_slots) {
  return moe_gemm_w4a8_reads_sorted(format, rows, expert_slots) && token_tiles_for(rows, expert_slots) <= 2;
}

void moe_gemm_w4a8(const GemmW4A8Args& p, cudaStream_t stream) {
  check(p.n % 16 == 0 && p.k % kGemmKBlock == 0, "moe_gemm_w4a8: N ", p.n, " and K ", p.k,
        " must be multiples of 16 and 64");
  check(!p.glu || (p.splits == 1 && (p.weight_format == ExpertWeightFormat::kFp8 ||
                                      !takes_mma_sync(token_tiles_for(p.max_rows, p.expert_slots, p.max_tile_rows), p.math))),
        "moe_gemm_w4a8: the fused activation takes wgmma tiles and one K split");
  const int64_t kblocks = p.k / kGemmKBlock;
  check(p.splits >= 1 && p.expert_slots >= 1 && p.splits <= kblocks &&
            (p.splits - 1) * ((kblocks + p.splits - 1) / p.splits) < kblocks,
        "moe_gemm_w4a8: bad grid (", p.splits, " K splits of ", kblocks, " K blocks)");
  switch (token_tiles_for(p.max_rows, p.expert_slots, p.max_tile_rows)) {
    case 1: return launch_tiles<1>(p, stream);
    case 2: return launch_tiles<2>(p, stream);
    case 4: return launch_tiles<4>(p, stream);
    case 8: return launch_tiles<8>(p, stream);
    default:  // 128-row tiles for INT4 weights; FP8 weights keep 64
      return p.weight_format == ExpertWeightFormat::kFp8 ? launch_tiles<8>(p, stream) : launch_tiles<16>(p, stream);
  }
}

}  // namespace nibble::cuda
