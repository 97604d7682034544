// Router logits, softmax top-k, and grouping by expert: one launch for up to 1024 tokens (blocks
// that count themselves done, or a cluster for a few (token, expert) pairs), else three kernels.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cuda/cuda_check.h"
#include "cuda/env_setting.h"
#include "cuda/fp8_rows.cuh"
#include "cuda/launch.h"
#include "cuda/lt_fp8_gemm.h"
#include "cuda/moe_route.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kLogitWarps = 8;

// A router logit is the sum of 32 lane partials (lane l: the 8-bf16 units l, l + 32, ... of the row,
// in order) by a butterfly: both routing paths compute it exactly so, with explicit roundings (no
// contraction left to the compiler), and so get the same logits bit for bit.
__device__ inline float lane_partial(const uint4* x, const uint4* w, int64_t units, int lane) {
  float sum = 0.0f;
#pragma unroll 8
  for (int64_t i = lane; i < units; i += 32) {
    const uint4 xv = x[i], wv = w[i];
    const auto* xh = reinterpret_cast<const __nv_bfloat162*>(&xv);
    const auto* wh = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = __bfloat1622float2(xh[j]), b = __bfloat1622float2(wh[j]);
      sum = __fadd_rn(sum, __fmaf_rn(a.y, b.y, __fmul_rn(a.x, b.x)));
    }
  }
  return sum;
}

__device__ inline float butterfly_sum(float sum) {
  for (int o = 16; o > 0; o /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(0xFFFFFFFFu, sum, o));
  return sum;
}

__device__ inline const uint4* row_units(const void* matrix, int64_t row, int64_t hidden) {
  return reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(matrix) + row * hidden);
}

// Before the grid dependency wait (the router is constant, launch.h): asks L2 for the router's rows,
// a thread a row, so that the logits' loads of them after the wait hit L2 (between layers the expert
// weights stream through L2 and evict them). Block b of G, thread i: rows b + i·G, b + (i + blockDim)·G...
__device__ inline void prefetch_router_rows(const RouteArgs& p) {
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  for (int64_t e = blockIdx.x + int64_t{threadIdx.x} * gridDim.x; e < p.experts; e += stride)
    ptx::prefetch_l2_bulk(row_units(p.router, e, p.hidden), static_cast<uint32_t>(p.hidden * 2));
}

// The logits of kTok tokens from t0 and kExp experts e0, e0 + kLogitWarps, ... (one warp): each
// (token, expert) pair summed exactly as lane_partial and butterfly_sum do (the same lane partials, in
// the same order, with the same roundings), so that every kernel's logits agree bit for bit. One pass
// over the units serves every pair: each router row is read once for kTok tokens and each x row once
// for kExp experts (a warp an expert read both once a pair: at DeepSeek-V3's 256 tokens about 940 MB
// from L2). Pairs past T or E are computed from clamped rows and not stored.
template <int kTok, int kExp>
__device__ inline void tile_logits(const RouteArgs& p, int64_t t0, int64_t e0, int lane) {
  const int64_t units = p.hidden / 8;
  const uint4* x[kTok];
  const uint4* w[kExp];
#pragma unroll
  for (int i = 0; i < kTok; ++i) x[i] = row_units(p.x, min(t0 + i, p.tokens - 1), p.hidden);
#pragma unroll
  for (int j = 0; j < kExp; ++j) w[j] = row_units(p.router, min(e0 + j * kLogitWarps, p.experts - 1), p.hidden);
  float sum[kTok][kExp] = {};
#pragma unroll(kTok * kExp == 1 ? 8 : kTok * kExp > 4 ? 1 : 4)
  for (int64_t u = lane; u < units; u += 32) {
    uint4 xv[kTok], wv[kExp];
#pragma unroll
    for (int i = 0; i < kTok; ++i) xv[i] = x[i][u];
#pragma unroll
    for (int j = 0; j < kExp; ++j) wv[j] = w[j][u];
#pragma unroll
    for (int i = 0; i < kTok; ++i)
#pragma unroll
      for (int j = 0; j < kExp; ++j) {
        const auto* xh = reinterpret_cast<const __nv_bfloat162*>(&xv[i]);
        const auto* wh = reinterpret_cast<const __nv_bfloat162*>(&wv[j]);
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          const float2 a = __bfloat1622float2(xh[h]), b = __bfloat1622float2(wh[h]);
          sum[i][j] = __fadd_rn(sum[i][j], __fmaf_rn(a.y, b.y, __fmul_rn(a.x, b.x)));
        }
      }
  }
#pragma unroll
  for (int i = 0; i < kTok; ++i)
#pragma unroll
    for (int j = 0; j < kExp; ++j) {
      const float total = butterfly_sum(sum[i][j]);
      const int64_t t = t0 + i, e = e0 + j * kLogitWarps;
      if (lane == 0 && t < p.tokens && e < p.experts) p.logits[t * p.experts + e] = total;
    }
}

// The experts a block's logits cover: kWarps warps (kLogitWarps unless told) of kExp each.
template <int kExp, int kWarps = kLogitWarps>
constexpr int64_t kBlockExperts = int64_t{kWarps} * kExp;

// Before the grid dependency wait, the first block of each expert column asks L2 for its router rows.
template <int kExp, int kWarps = kLogitWarps>
__device__ inline void prefetch_block_router_rows(const RouteArgs& p) {
  const int64_t e = blockIdx.y * kBlockExperts<kExp, kWarps> + threadIdx.x;
  if (blockIdx.x == 0 && threadIdx.x < kBlockExperts<kExp, kWarps> && e < p.experts)
    ptx::prefetch_l2_bulk(row_units(p.router, e, p.hidden), static_cast<uint32_t>(p.hidden * 2));
}

// Grid (⌈T / kTok⌉, ⌈E / (8·kExp)⌉): block (i, j) the logits of tokens i·kTok.. and experts j·8·kExp..
template <int kTok, int kExp>
__global__ void __launch_bounds__(kLogitWarps * 32) router_logits_kernel(const __grid_constant__ RouteArgs p) {
  prefetch_block_router_rows<kExp>(p);
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int warp = static_cast<int>(threadIdx.x / 32);
  tile_logits<kTok, kExp>(p, int64_t{blockIdx.x} * kTok, blockIdx.y * kBlockExperts<kExp> + warp,
                          static_cast<int>(threadIdx.x % 32));
}

// Logit tiles by size: from 16 tokens, 8 tokens and (from 32 experts) 4 experts a warp, so that a
// tile's pairs share its loads; fewer tokens one pair a warp, spread over the most blocks (DeepSeek-V3's
// one token: 32 blocks; with 4 experts a warp its routing took 20.7 µs a call, twenty-fifth session).
// `warps`: a block's (kLogitWarps, or 2 for the counted kernel's single pairs: spread_single_pairs).
struct LogitTile {
  int tokens, experts, warps = kLogitWarps;
};
LogitTile logit_tile(int64_t tokens, int64_t experts) {
  return tokens >= 16 ? LogitTile{8, experts >= 32 ? 4 : 1} : LogitTile{1, 1};
}

// One warp, token t: optional soft-cap, softmax over E, then K rounds of a warp-wide argmax.
__device__ void topk_token(const RouteArgs& p, int64_t t, int lane) {
  constexpr int kPerLane = kMaxExperts / 32;
  float prob[kPerLane];
  float max_logit = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t e = i * 32 + lane;
    prob[i] = e < p.experts ? __ldcg(p.logits + t * p.experts + e) : -FLT_MAX;  // through L2: other blocks' logits
    if (p.softcap > 0.0f && e < p.experts) prob[i] = p.softcap * tanhf(prob[i] / p.softcap);
    max_logit = fmaxf(max_logit, prob[i]);
  }
  for (int o = 16; o > 0; o /= 2) max_logit = fmaxf(max_logit, __shfl_xor_sync(0xFFFFFFFFu, max_logit, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    prob[i] = i * 32 + lane < p.experts ? expf(prob[i] - max_logit) : 0.0f;
    sum += prob[i];
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) prob[i] = i * 32 + lane < p.experts ? prob[i] / sum : -1.0f;

  float chosen_sum = 0.0f;
  float my_weight = 0.0f;  // lane k keeps the k-th weight
  int my_id = 0;
  for (int k = 0; k < p.top_k; ++k) {
    float best = -1.0f;
    int best_id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (prob[i] > best) best = prob[i], best_id = i * 32 + lane;  // lowest id wins within a lane
    for (int o = 16; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      const int other_id = __shfl_xor_sync(0xFFFFFFFFu, best_id, o);
      if (other > best || (other == best && other_id < best_id)) best = other, best_id = other_id;
    }
    if (best_id % 32 == lane) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (i == best_id / 32) prob[i] = -2.0f;  // taken
    }
    if (lane == k) my_weight = best, my_id = best_id;
    chosen_sum += best;
  }
  if (lane < p.top_k) {
    p.topk_ids[t * p.top_k + lane] = my_id;
    p.topk_weights[t * p.top_k + lane] = p.norm == RouterNorm::kRenormalize ? my_weight / chosen_sum : my_weight;
  }
}

// One warp per token.
__global__ void topk_kernel(const __grid_constant__ RouteArgs p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (t < p.tokens) topk_token(p, t, static_cast<int>(threadIdx.x % 32));
}

constexpr int kGroupThreads = 1024;

// One block (a multiple of 32 threads): counts, offsets and the active list, then each pair's sorted
// position. Rows keep the pairs' order within an expert (a stable sort), so one routing always gives
// the same rows: the ranks of a tensor-parallel group, each grouping alone, agree row by row, as the
// cross-rank amax of the activation quantization (indexed by row, moe_quantize.h) needs. Pairs go in
// chunks of a thread each: a pair's row is its expert's cursor, plus the same expert's pairs in the
// warps before (warp_counts), plus those in its own warp's lanes before (a match).
// Up to 32 pairs (decode's few tokens) grouped with no shared memory and no block barrier, the rows of
// group_pairs: every warp holds the pairs' experts a lane each (kNone past the last), every thread
// writes the offsets of experts threadIdx.x, threadIdx.x + blockDim.x, ... (the pairs of lower
// experts), and warp 0 each pair's row (the pairs of lower experts, then those of its expert before it)
// and the active list (an expert's first pair writes it at the count of lower experts' first pairs).
constexpr int64_t kMaxWarpGroupedPairs = 32;
__device__ void group_few_pairs(const GroupArgs& p) {
  constexpr int kNone = INT32_MAX;
  const int pairs = static_cast<int>(p.tokens * p.top_k), lane = static_cast<int>(threadIdx.x % 32);
  const int mine = lane < pairs ? __ldcg(p.topk_ids + lane) : kNone;  // through L2, as group_pairs
  const unsigned lanes_before = (1u << lane) - 1u;
  const unsigned same = __match_any_sync(0xFFFFFFFFu, mine);
  const bool first = (same & lanes_before) == 0 && mine != kNone;
  const unsigned firsts = __ballot_sync(0xFFFFFFFFu, first);
  for (int64_t e0 = threadIdx.x - lane; e0 <= p.experts; e0 += blockDim.x) {  // whole warps: the shuffles
    const int64_t e = e0 + lane;
    int below = 0, row = 0, slot = 0;
    for (int j = 0; j < pairs; ++j) {
      const int other = __shfl_sync(0xFFFFFFFFu, mine, j);
      below += other < e;
      row += other < mine || (other == mine && j < lane);
      slot += other < mine && ((firsts >> j) & 1u) != 0;
    }
    if (e <= p.experts) p.expert_offsets[e] = below;  // [E]: every pair
    if (e0 == 0 && mine != kNone) {  // warp 0
      p.row_pos[lane] = row;
      p.sorted_tokens[row] = static_cast<int32_t>(lane / p.top_k);
      if (first) p.active_experts[slot] = mine;
      if (lane == 0) p.active_experts[p.experts] = __popc(firsts);
    }
  }
}

// counts, cursor: kMaxExperts ints of shared memory each; warp_counts: (warps, kMaxExperts) bytes.
// few_by_warp false: the block's way for any count (a timing probe).
__device__ void group_pairs(const GroupArgs& p, int* counts, int* cursor, uint8_t* warp_counts,
                            bool few_by_warp = true) {
  const int64_t pairs = p.tokens * p.top_k;
  if (few_by_warp && pairs <= kMaxWarpGroupedPairs) return group_few_pairs(p);
  const int warp = static_cast<int>(threadIdx.x / 32), warps = static_cast<int>(blockDim.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const unsigned lanes_before = (1u << lane) - 1u;
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) counts[e] = 0;
  for (int j = threadIdx.x; j < warps * kMaxExperts; j += blockDim.x) warp_counts[j] = 0;
  __syncthreads();
  // The ids are read through L2 (__ldcg): route_topk_group_kernel's last block reads other blocks' ids.
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) atomicAdd(&counts[__ldcg(p.topk_ids + i)], 1);
  __syncthreads();
  // Offsets and the active list, by warp 0: lane l takes `per` consecutive experts, then an exclusive
  // scan of the lanes' rows and active counts.
  if (warp == 0) {
    const int E = static_cast<int>(p.experts), per = (E + 31) / 32, first = lane * per, end = min(first + per, E);
    int rows = 0, active = 0;
    for (int e = first; e < end; ++e) rows += counts[e], active += counts[e] > 0;
    int offset = rows, slot = active;  // inclusive, then exclusive
    for (int o = 1; o < 32; o *= 2) {
      const int r = __shfl_up_sync(0xFFFFFFFFu, offset, o), a = __shfl_up_sync(0xFFFFFFFFu, slot, o);
      if (lane >= o) offset += r, slot += a;
    }
    if (lane == 31) {
      p.expert_offsets[E] = offset;
      p.active_experts[E] = slot;
    }
    offset -= rows, slot -= active;
    for (int e = first; e < end; ++e) {
      p.expert_offsets[e] = offset;
      cursor[e] = offset;
      if (counts[e] > 0) p.active_experts[slot++] = e;
      offset += counts[e];
    }
  }
  __syncthreads();
  for (int64_t base = 0; base < pairs; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const int e = i < pairs ? __ldcg(p.topk_ids + i) : -1;
    const unsigned same = __match_any_sync(0xFFFFFFFFu, e);
    const bool leader = (same & lanes_before) == 0;  // the lowest lane of its expert in this warp
    if (e >= 0 && leader) warp_counts[warp * kMaxExperts + e] = static_cast<uint8_t>(__popc(same));
    __syncthreads();
    if (e >= 0) {
      int pos = cursor[e] + __popc(same & lanes_before);
      for (int w = 0; w < warp; ++w) pos += warp_counts[w * kMaxExperts + e];
      p.sorted_tokens[pos] = static_cast<int32_t>(i / p.top_k);
      p.row_pos[i] = pos;
    }
    __syncthreads();  // every cursor and count of this chunk read
    if (e >= 0 && leader) {
      atomicAdd(&cursor[e], __popc(same));
      warp_counts[warp * kMaxExperts + e] = 0;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kGroupThreads) group_kernel(const __grid_constant__ GroupArgs p) {
  __shared__ int counts[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ uint8_t warp_counts[kGroupThreads / 32 * kMaxExperts];
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  group_pairs(p, counts, cursor, warp_counts);
}

// Routing and grouping of a few tokens in one launch, on one cluster of kRouteCluster blocks. The
// lane partials of every (token, expert) pair (32 a pair) are spread over the cluster's threads, a
// thread a partial; the cluster's warps then gather each pair's 32 through distributed shared memory
// and sum them by the same butterfly (the logits of router_logits_kernel, bit for bit) into global
// memory, and block 0 takes the top-k of each token and groups the pairs by expert.
constexpr int kRouteCluster = 8;
constexpr int kRouteThreads = 256;
// tokens × experts: measured on an H200 (bench/RESULTS.md), the one launch took 10.7 µs for Mixtral's
// one token (the three kernels 13.9) but 27.3 µs for its 32 tokens (13.8).
constexpr int64_t kMaxFusedPairs = 32;
constexpr int64_t kMaxBlockPartials = kMaxFusedPairs * 32 / kRouteCluster;

struct RouteGroupArgs {
  RouteArgs route;
  GroupArgs group;
  QuantizeRowsArgs quantize;  // route_topk_group_kernel: quantize.codes null, or each block quantizes its token
  // route_topk_group_kernel's timing probes (NIBBLE_ROUTE_PROBE; wrong results): 1 returns after the
  // dependency wait (the launch alone), 2 after the logits, 3 after the top-k (no grouping), 4 skips
  // the logits (the counting, top-k and grouping alone), 5 groups up to 32 pairs the block's way too
  // (group_pairs, few_by_warp).
  int probe = 0;
};

__global__ void __launch_bounds__(kRouteThreads) route_group_kernel(const __grid_constant__ RouteGroupArgs a) {
  __shared__ float partial[kMaxBlockPartials];  // lane partials [q·per, (q + 1)·per) of (T, E, 32)
  __shared__ int counts[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ uint8_t warp_counts[kRouteThreads / 32 * kMaxExperts];
  const RouteArgs& p = a.route;
  prefetch_router_rows(p);
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t C = cluster.num_blocks(), q = cluster.block_rank();
  const int64_t pairs = p.tokens * p.experts, partials = pairs * 32, per = (partials + C - 1) / C;
  for (int64_t i = q * per + threadIdx.x; i < min(partials, (q + 1) * per); i += blockDim.x) {
    const int64_t pair = i / 32;
    partial[i - q * per] = lane_partial(row_units(p.x, pair / p.experts, p.hidden),
                                        row_units(p.router, pair % p.experts, p.hidden), p.hidden / 8,
                                        static_cast<int>(i % 32));
  }
  cluster.sync();  // every block's partials written
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t pair = q * warps + warp; pair < pairs; pair += C * warps) {  // a warp a pair, cluster-wide
    const int64_t i = pair * 32 + lane;
    const float sum = butterfly_sum(*cluster.map_shared_rank(&partial[i % per], static_cast<unsigned>(i / per)));
    if (lane == 0) p.logits[pair] = sum;
  }
  // Every block done reading the others' shared memory, and the logits (global memory) written before
  // the barrier visible to block 0 after it (release and acquire at cluster scope).
  cluster.sync();
  if (q != 0) return;
  for (int64_t t = warp; t < p.tokens; t += warps) topk_token(p, t, lane);
  __syncthreads();  // the top-k ids written (global memory, read back by this block)
  group_pairs(a.group, counts, cursor, warp_counts);
}

// Routing and grouping in one launch for up to kMaxCountedTokens tokens: grid (⌈T / kTok⌉, ⌈E / (8·kExp)⌉),
// block (i, j) the logits of token tile i and expert column j (tile_logits) and the FP8 rows of
// the tile's tokens j, j + columns, ... (when asked); the last column of a tile to finish (counter
// blocks_done[1 + i]) takes its tokens' top-k (warp w token i·kTok + w, as topk_kernel); the last tile
// to finish (counter blocks_done[0]) groups every pair (as group_kernel). Each resets its counter for
// the next launch. Mixtral and Grok-1 (8 experts) take one block a token and one column. Measured on an
// H200 (bench/RESULTS.md), the three kernels took 5.6 + 4.4 + 2.8 µs for Mixtral's 32 tokens; at
// DeepSeek-V3's one token (256 experts) 5.4 + 8.4 + 17.3 µs exposed in the layer (twenty-fifth session).
constexpr int64_t kMaxCountedTokens = 1024;

template <int kTok, int kExp, int kWarps = kLogitWarps>
__global__ void __launch_bounds__(kWarps * 32) route_topk_group_kernel(const __grid_constant__ RouteGroupArgs a) {
  static_assert(kExp == 1 || kWarps == kLogitWarps, "tile_logits strides a warp's experts by kLogitWarps");
  __shared__ int counts[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ uint8_t warp_counts[kWarps * kMaxExperts];
  __shared__ bool last;
  __shared__ float warp_amax[kWarps];
  const RouteArgs& p = a.route;
  prefetch_block_router_rows<kExp, kWarps>(p);
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (a.probe == 1) return;
  const int64_t t0 = int64_t{blockIdx.x} * kTok;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (a.probe != 4) tile_logits<kTok, kExp>(p, t0, blockIdx.y * kBlockExperts<kExp, kWarps> + warp, lane);
  if (a.probe == 2) return;
  const QuantizeRowsArgs& q = a.quantize;
  for (int64_t i = blockIdx.y; q.codes != nullptr && i < kTok && t0 + i < p.tokens; i += gridDim.y) {
    const int64_t t = t0 + i;  // the whole block: token t's row to FP8
    quantize_bf16_row_fp8(q.x, t, q.cols, q.codes + t * q.cols, q.scale + t,
                          q.sums != nullptr ? q.sums + t * (q.cols / kRowBlock) : nullptr, warp_amax);
    __syncthreads();  // warp_amax read by every thread before the next row's
  }
  uint32_t* done = a.group.blocks_done;
  if (gridDim.y > 1) {  // the tile's last column to finish takes its top-k
    __threadfence();    // this block's logits visible to the grid before it counts itself done
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done + 1 + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) done[1 + blockIdx.x] = 0;
  }
  __syncthreads();  // the tile's logits written (global memory, read back through L2)
  if (warp < kTok && t0 + warp < p.tokens) topk_token(p, t0 + warp, lane);
  if (a.probe == 3) return;
  if (gridDim.x > 1) {  // the last tile to finish groups (a lone tile is the last)
    __threadfence();      // this block's top-k visible to the grid before it counts itself done
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *done = 0;
  }
  __syncthreads();  // the top-k ids written (global memory, read back by this block)
  group_pairs(a.group, counts, cursor, warp_counts, a.probe != 5);
}

// The instantiations for a tile (kTok 1 or 8, kExp 1 or 4).
auto* logits_kernel_for(LogitTile tile) {
  if (tile.tokens == 8) return tile.experts == 4 ? router_logits_kernel<8, 4> : router_logits_kernel<8, 1>;
  return tile.experts == 4 ? router_logits_kernel<1, 4> : router_logits_kernel<1, 1>;
}
auto* counted_kernel_for(LogitTile tile) {
  if (tile.warps == 2) return route_topk_group_kernel<1, 1, 2>;
  if (tile.tokens == 8) return tile.experts == 4 ? route_topk_group_kernel<8, 4> : route_topk_group_kernel<8, 1>;
  return tile.experts == 4 ? route_topk_group_kernel<1, 4> : route_topk_group_kernel<1, 1>;
}

// The tile's grid over T tokens and E experts.
dim3 tile_grid(LogitTile tile, int64_t tokens, int64_t experts) {
  return {static_cast<unsigned>((tokens + tile.tokens - 1) / tile.tokens),
          static_cast<unsigned>((experts + tile.warps * tile.experts - 1) / (tile.warps * tile.experts))};
}

// The counted kernel's single pairs (fewer than 16 tokens of more than 8 experts) in blocks of 2 warps,
// over 4 times the SMs (DeepSeek-V3's one token: 128 blocks, each reading 28 KB of router rows rather
// than 112); NIBBLE_ROUTE_SPREAD=0: blocks of kLogitWarps. Measured on an H100 (bench/RESULTS.md,
// thirty-fourth session, the layer graph-replayed): DeepSeek-V3 one token 97.3-97.8 µs against
// 98.9-99.1, 8 tokens 429.3-430.5 against 431.8-432.8.
bool spread_single_pairs() {
  static const bool on = env_choice("NIBBLE_ROUTE_SPREAD", {"0", "1"}) != "0";
  return on;
}

// The counted kernel's tile: one block a token and one column for up to 8 experts (each block also
// quantizes its token); for more, the logits' tile.
LogitTile counted_tile(int64_t tokens, int64_t experts) {
  if (experts <= kLogitWarps) return LogitTile{1, 1};
  const LogitTile tile = logit_tile(tokens, experts);
  return tile.tokens == 1 && spread_single_pairs() ? LogitTile{1, 1, 2} : tile;
}

// Few (token, expert) pairs (at most 32) can take either one-launch kernel; NIBBLE_ROUTE=cluster or
// counted picks one for every size it takes; by default the counted kernel. Measured on an H200
// (bench/RESULTS.md, 2026-11-30, RouteAndGroup.Timing, graph-replayed µs a call, cluster / counted):
// Mixtral 1 token 7.99 / 6.65, 4 tokens 8.01 / 7.68, 16 and 32 tokens equal; Grok-1 1 token 8.79 / 7.38.
enum class RouteKernel { kAuto, kCluster, kCounted };
RouteKernel route_kernel_setting() {
  static const RouteKernel setting = [] {
    const std::string name = env_choice("NIBBLE_ROUTE", {"auto", "cluster", "counted"});
    return name == "cluster" ? RouteKernel::kCluster : name == "counted" ? RouteKernel::kCounted : RouteKernel::kAuto;
  }();
  return setting;
}

// NIBBLE_MOE_QUANTIZE=route (the default) or kernel: whether route_and_group quantizes x in its launch
// where it can, or always in quantize_rows_fp8's own.
bool quantize_in_route() {
  static const bool fused = env_choice("NIBBLE_MOE_QUANTIZE", {"route", "kernel"}) != "kernel";
  return fused;
}

// NIBBLE_ROUTE_PROBE (RouteGroupArgs::probe): 0 (unset) or a timing probe, 1 to 5.
int route_probe() {
  static const int probe = [] {
    const std::string v = env_choice("NIBBLE_ROUTE_PROBE", {"0", "1", "2", "3", "4", "5"});
    return v.empty() ? 0 : v[0] - '0';
  }();
  return probe;
}

}  // namespace

bool route_and_group(const RouteArgs& route, const GroupArgs& group, cudaStream_t stream,
                     const QuantizeRowsArgs* quantize) {
  check(route.tokens == group.tokens && route.experts == group.experts && route.top_k == group.top_k &&
            route.topk_ids == group.topk_ids,
        "route_and_group: the routing and grouping arguments disagree");
  const bool counted = group.blocks_done != nullptr && route.tokens <= kMaxCountedTokens;
  const bool fits_cluster = route.tokens * route.experts <= kMaxFusedPairs;
  const RouteKernel setting = route_kernel_setting();
  const bool takes_counted = route.tokens > 0 && counted && (!fits_cluster || setting != RouteKernel::kCluster);
  if (quantize != nullptr) {
    check(quantize->x == route.x && quantize->rows == route.tokens && quantize->cols == route.hidden &&
              quantize->static_scale == 0.0f && quantize->src_row == nullptr && quantize->sorted_codes == nullptr &&
              quantize->amax_out == nullptr && quantize->amax_in == nullptr && route.hidden % kRowBlock == 0,
          "route_and_group: a quantization it cannot fuse");
    if (!takes_counted || !quantize_in_route()) {
      route_and_group(route, group, stream);
      quantize_rows_fp8(*quantize, stream);
      return false;
    }
  }
  if (route.tokens == 0 || (route.tokens * route.experts > kMaxFusedPairs && !counted)) {
    route_topk(route, stream);
    group_by_expert(group, stream);
    return false;
  }
  check(route.experts >= 1 && route.experts <= kMaxExperts, "route_and_group: ", route.experts,
        " experts (at most ", kMaxExperts, ")");
  check(route.top_k >= 1 && route.top_k <= kMaxTopK && route.top_k <= route.experts, "route_and_group: top_k ",
        route.top_k);
  check(route.hidden % 8 == 0, "route_and_group: hidden size ", route.hidden, " is not a multiple of 8");
  if (takes_counted) {
    const LogitTile tile = counted_tile(route.tokens, route.experts);
    const dim3 grid = tile_grid(tile, route.tokens, route.experts);
    check(grid.y == 1 || grid.x <= kRouteTileCounters, "route_and_group: ", grid.x, " token tiles");
    launch_kernel(counted_kernel_for(tile), grid, tile.warps * 32, 0, stream,
                  RouteGroupArgs{.route = route, .group = group,
                                 .quantize = quantize != nullptr ? *quantize : QuantizeRowsArgs{},
                                 .probe = route_probe()});
    return quantize != nullptr;
  }
  launch_kernel_with({cluster_shape(kRouteCluster)}, route_group_kernel, kRouteCluster, kRouteThreads, 0, stream,
                     RouteGroupArgs{.route = route, .group = group, .quantize = {}});
  return false;
}

void route_topk(const RouteArgs& p, cudaStream_t stream) {
  check(p.experts >= 1 && p.experts <= kMaxExperts, "route_topk: ", p.experts, " experts (at most ", kMaxExperts, ")");
  check(p.top_k >= 1 && p.top_k <= kMaxTopK && p.top_k <= p.experts, "route_topk: top_k ", p.top_k);
  if (p.tokens == 0) return;
  check(p.hidden % 8 == 0, "route_topk: hidden size ", p.hidden, " is not a multiple of 8");
  if (p.blas != nullptr && p.tokens >= kTensorLogitsMinTokens) {
    // logits (T, E) row-major = x (T, H) · routerᵀ: in cuBLAS's column-major terms logits (E × T, ld E)
    // = router (stored H × E, transposed) · x (H × T).
    const float one = 1.0f, zero = 0.0f;
    cublas_check(cublasSetStream(p.blas, stream));
    cublas_check(cublasGemmEx(p.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.experts),
                              static_cast<int>(p.tokens), static_cast<int>(p.hidden), &one, p.router, CUDA_R_16BF,
                              static_cast<int>(p.hidden), p.x, CUDA_R_16BF, static_cast<int>(p.hidden), &zero,
                              p.logits, CUDA_R_32F, static_cast<int>(p.experts), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  } else {
    const LogitTile tile = logit_tile(p.tokens, p.experts);
    launch_kernel(logits_kernel_for(tile), tile_grid(tile, p.tokens, p.experts), kLogitWarps * 32, 0, stream, p);
    cuda_check(cudaGetLastError());
  }
  constexpr int kWarpsPerBlock = 4;
  launch_kernel(topk_kernel, static_cast<unsigned>((p.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock),
                kWarpsPerBlock * 32, 0, stream, p);
  cuda_check(cudaGetLastError());
}

void group_by_expert(const GroupArgs& p, cudaStream_t stream) {
  check(p.experts >= 1 && p.experts <= kMaxExperts, "group_by_expert: ", p.experts, " experts");
  launch_kernel(group_kernel, 1, kGroupThreads, 0, stream, p);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
