// Split-KV paged decode attention on the tensor cores (attention_decode.h).
#include "cuda/attention_decode.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>

#include "cuda/attention_mma.cuh"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/env_setting.h"
#include "cuda/kv_store.cuh"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"
#include "cuda/rope.cuh"

namespace nibble::cuda {
namespace {

using attention_mma::fp8x2_to_f16x2;
using attention_mma::mma;
using attention_mma::pack2;

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;
constexpr int kHeadDim = 128;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpKeys = 32;  // keys a warp takes at a time: four n8 tiles of Q·Kᵀ, two k16 steps of P·V
constexpr int kMaxGroup = 8;   // query heads per KV head: the MMA rows (of 16) that are real
constexpr int kMaxSplits = 32;
constexpr int kMaxClusterSlices = 16;  // a cluster's blocks at most (max_cluster_slices)

struct DecodeArgs {
  const bf16* qkv;             // (S, width)
  const void* k_cache;         // (blocks, block_size, kv_heads, D)
  const void* v_cache;
  const int32_t* block_tables;  // (S, max_blocks)
  const int32_t* seq_lens;      // (S)
  float* part_acc;             // (S, Hq, splits, D): Σ p·v of each slice, unnormalized
  float* part_ml;              // (S, Hq, splits, 2): running max and Σ p of each slice
  bf16* out;                   // (S, Hq·D)
  int64_t width, max_blocks;
  int block_size;  // 32-bit: a tile's key / block_size in its load's dependency chain
  int heads, kv_heads, group, splits;
  int chunk_align;  // a slice's keys are a multiple of this (kWarps · kWarpKeys: every warp the same tiles)
  float q_scale, logit_softcap, v_scale;
  // rope_attention's decode steps (attention_decode.h), else inv_freq null.
  const float* inv_freq;         // (D / 2)
  const int32_t* positions;      // (S)
  const int32_t* slot_mapping;   // (S)
  void* k_store;                 // the caches, where the new key and value go
  void* v_store;
  float k_store_scale, v_store_scale;  // FP8: code = value / scale
  bool trigger_first;  // launch.h: the next kernel (the merge, or the o projection) launched before the wait
};

static_assert(kThreads == kHeadDim, "the KV append takes an element of v a thread");

// Sequence s's new key (kv head kh), rotated by the step's angles, and its value into the cache: the
// arithmetic of rope_append_kv_kernel (attention.cu), element by element.
template <bool kFp8>
__device__ inline void append_new_kv(const DecodeArgs& a, int s, int kh, const float* sin, const float* cos) {
  const int64_t kv_width = int64_t{a.kv_heads} * kHeadDim;
  const int64_t at = a.slot_mapping[s] * kv_width + int64_t{kh} * kHeadDim;
  const bf16* k = a.qkv + s * a.width + (int64_t{a.heads} + kh) * kHeadDim;
  const int i = threadIdx.x;
  store_kv(a.v_store, kFp8, a.v_store_scale, at + i, __bfloat162float(k[kv_width + i]));
  if (i < kHeadDim / 2) {
    const float x1 = __bfloat162float(k[i]), x2 = __bfloat162float(k[i + kHeadDim / 2]);
    store_kv(a.k_store, kFp8, a.k_store_scale, at + i, rope_first(x1, x2, sin[i], cos[i]));
    store_kv(a.k_store, kFp8, a.k_store_scale, at + i + kHeadDim / 2, rope_second(x1, x2, sin[i], cos[i]));
  }
}

// Tensor-core decode attention. Each warp walks its own 32-key tiles of the block's slice with its own
// online softmax; the block's four warps merge at the end. Per tile: S (16 × 32) = Q (16 × 128: the
// group's heads in rows 0..G-1, the rest zero) · Kᵀ, then Oᵀ (128 × 16) += Vᵀ (128 × 32) · Pᵀ, so that
// P leaves the first MMA in the register layout the second one reads. Both MMAs take K positions in an
// order of our choosing: thread (g = lane / 4, t = lane % 4) loads dims [32t, 32t + 32) of its key for
// Q·Kᵀ (k-step j: dims 32t + 4j .. + 3) and, for Vᵀ, dims 32b + 4g .. + 3 of four keys; Oᵀ's row r of
// m-tile i is dim 32·(i / 2) + 4·(r % 8) + 2·(i % 2) + r / 8.
// kClusterMerge: the grid's x (the slices) is one thread-block cluster, whose blocks merge their slices
// through distributed shared memory and write the output, where otherwise each writes its slice to
// part_acc and part_ml for merge_kernel. (A third way, each block counting itself in and the last to
// arrive merging every slice, measured 25.1 µs a call at batch 1 against 15.7 with merge_kernel:
// fourteenth session.)
// Nsight Compute at Mixtral-8x7B batch 32 (fifteenth session): 159 registers hold an SM to 3 blocks (12
// warps), each warp waits 7.8 cycles an instruction, 3.4 of them on global loads; the kernel reads at
// 43% of DRAM bandwidth. Measured and not kept (CudaOpsTwin.DecodeAttentionTiming, µs at Mixtral b32 /
// Grok-1 tp 2 rank b32, against 40.3 / 31.8): the next tile in registers while the math runs (245
// registers, 2 blocks an SM) 47.3 / 38.8; FP8 tiles through each warp's shared memory by cp.async a
// tile ahead, the block-table slots two ahead, 38.2 / 32.8; the slots two ahead alone 41.3 / 32.0; V
// as one 16-byte load a key (a quarter of the load instructions) and no predicated loads 40.3 / 34.7.
// Sixteenth session: registers bounded to 128 (4 blocks an SM, 104 bytes of spills) 45.6 / 33.9 against
// 39.9 / 31.5.
// Sixteenth session, against 42.4 / 33.8 in that call: each block's slice asked of L2 before the grid
// dependency wait 53.5 / 41.1; one wave of persistent blocks walking the slices 41.2 / 34.4, with the
// next slice asked of L2 47.4 / 41.6 (the engine, Mixtral b32: 10.02 against 9.78 ms a step).
// Where the grid is one wave (kClusterMerge), each warp's first tile, the lengths, the block table's
// slots and the RoPE angles are read before the grid dependency wait, while the kernel before
// finishes (kEarlyTile). Measured on an H200 (bench/RESULTS.md, seventeenth session, every block
// early, µs a call): Mixtral b1 12.4 against 13.0, Grok-1 b1 11.4 / 12.8, Grok-1 tp 2 rank b1 10.2 /
// 11.2, and the engine at batch 1 3.55 against 3.61 ms a step; with more than one wave (merge_kernel)
// it lost (Mixtral b32 42.0 against 40.5, Grok-1 b32 53.9 / 52.8), only the first wave's blocks gaining.
// Seventeenth session, not kept: the FP8 tiles through a block's ring of 6 shared-memory stages filled
// by 2-D tensor copies (16-key boxes of one head, 128-byte swizzled; the first six tiles asked for as
// the block starts, each later one by the warp that frees its stage; V read as one 16-byte chunk a
// key), with merge_kernel: Mixtral b32 39.3, Grok-1 b32 53.1, Grok-1 tp 2 rank b32 35.7 against 40.2 /
// 52.4 / 32.0, the engine's Grok-1 rank b32 27.75 against 27.71 ms. (That build's warps could wait on
// a stage a phase ahead of its tile, which only makes it faster than a correct one.) With every tile
// of a block in flight at once and no faster, the loads' latency is not what bounds this kernel. Nor
// is the cache's layout: its bytes read as head-major pages (blocks, kv_heads, block_size, D), each
// page of a head 2 KB in a row, took 39.9 / 51.9 / 31.5 against 40.3 / 52.3 / 31.5 (same call).
// The FP8 kernels bounded to 168 registers: 3 blocks an SM.
template <bool kFp8, bool kClusterMerge>
__global__ void __launch_bounds__(kThreads, kFp8 ? 3 : 1) decode_kernel(const __grid_constant__ DecodeArgs a) {
  constexpr int kElemBytes = kFp8 ? 1 : 2;
  __shared__ float m_w[kWarps][kMaxGroup], l_w[kWarps][kMaxGroup];
  __shared__ float acc_w[kWarps][kMaxGroup][kHeadDim];
  __shared__ float slice_acc[kClusterMerge ? kMaxGroup : 1][kHeadDim];  // this block's slice, merged
  __shared__ float slice_m[kMaxGroup], slice_l[kMaxGroup];
  __shared__ float rope_sin[kHeadDim / 2], rope_cos[kHeadDim / 2];
  constexpr bool kEarlyTile = kClusterMerge;
  if constexpr (!kEarlyTile) ptx::dependency_wait(a.trigger_first);
  const int sp = blockIdx.x, kh = blockIdx.y, s = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, G = a.group;
  const int len = a.seq_lens[s];
  const int chunk = ((len + a.splits - 1) / a.splits + a.chunk_align - 1) / a.chunk_align * a.chunk_align;
  const int begin = sp * chunk, end = min(len, begin + chunk);
  const int64_t kv_width = int64_t{a.kv_heads} * kHeadDim;
  const auto* k_base = static_cast<const uint8_t*>(a.k_cache) + int64_t{kh} * kHeadDim * kElemBytes;
  const auto* v_base = static_cast<const uint8_t*>(a.v_cache) + int64_t{kh} * kHeadDim * kElemBytes;
  const int32_t* table = a.block_tables + s * a.max_blocks;

  // A tile's keys and values: lane i finds the slot of the tile's key i. K: n-tile c's key 8c + g,
  // dims [32t, 32t + 32). V: k-step u's keys 16u + 2t, +1, +8, +9; dims 32b + 4g .. + 3 of each.
  constexpr int kKVecs = 2 * kElemBytes;  // 16-byte loads
  using VWord = std::conditional_t<kFp8, uint32_t, uint2>;
  uint4 k_raw[4][kKVecs];
  VWord v_raw[2][4][4];
  auto load_tile = [&](int tile) {
    const int key = tile + lane;
    const int page = static_cast<int>(static_cast<unsigned>(key) / static_cast<unsigned>(a.block_size));
    const int64_t slot = key < end ? int64_t{table[page]} * a.block_size + (key - page * a.block_size) : -1;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t ks = __shfl_sync(0xFFFFFFFFu, slot, 8 * c + g);
      const auto* row = reinterpret_cast<const uint4*>(k_base + (ks * kv_width + 32 * t) * kElemBytes);
#pragma unroll
      for (int v = 0; v < kKVecs; ++v) k_raw[c][v] = ks >= 0 ? row[v] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t vs = __shfl_sync(0xFFFFFFFFu, slot, 16 * u + 2 * t + (e & 1) + 8 * (e >> 1));
#pragma unroll
        for (int b = 0; b < 4; ++b)
          v_raw[u][e][b] = vs >= 0 ? *reinterpret_cast<const VWord*>(v_base + (vs * kv_width + 32 * b + 4 * g) * kElemBytes)
                                   : VWord{};
      }
  };
  const int tiles = begin < end ? (end - begin + kWarpKeys - 1) / kWarpKeys : 0;
  // The lengths, tables and positions come from the host and the older keys from earlier steps, so
  // tiles are read before the wait, unless they hold the step's new key (key len - 1, appended by this
  // kernel or the one before).
  auto old_keys_only = [&](int key) { return min(key + kWarpKeys, end) < len; };
  bool first_loaded = false;
  if constexpr (kEarlyTile) {
    const int first = begin + warp * kWarpKeys;
    if (warp < tiles && old_keys_only(first)) {
      load_tile(first);
      first_loaded = true;
    }
  }
  const bool rope = a.inv_freq != nullptr;
  if (rope && threadIdx.x < kHeadDim / 2)  // the step's angles
    rope_sincos(static_cast<float>(a.positions[s]), a.inv_freq[threadIdx.x], rope_sin[threadIdx.x],
                rope_cos[threadIdx.x]);
  if constexpr (kEarlyTile) ptx::dependency_wait(a.trigger_first);
  if (rope) {  // the block holding the new key appends it (and its value) first
    __syncthreads();
    if (begin < len && end == len) append_new_kv<kFp8>(a, s, kh, rope_sin, rope_cos);
  }

  // Q as A fragments, k-step j: {row g: dims 32t + 4j, +1}, {row g: dims 32t + 4j + 2, +3}. With RoPE,
  // dims d < 64 and d + 64 pair up: thread t's partner dims are those of thread t ^ 2.
  uint32_t qa[8][2] = {};
  if (g < G) {
    const bf16* head = a.qkv + s * a.width + (int64_t{kh} * G + g) * kHeadDim;
    const auto* q = reinterpret_cast<const uint4*>(head + 32 * t);
    const auto* partner = reinterpret_cast<const uint4*>(head + 32 * (t ^ 2));
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 raw = q[v], other = rope ? partner[v] : raw;
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w}, others[4] = {other.x, other.y, other.z, other.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t word = words[w];
        if (rope) {
          const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
          const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&others[w]));
          const int j = 32 * (t & 1) + 8 * v + 2 * w;  // the pair index of dims 32t + 8v + 2w, +1
          const float2 r = t < 2 ? make_float2(rope_first(x.x, y.x, rope_sin[j], rope_cos[j]),
                                               rope_first(x.y, y.y, rope_sin[j + 1], rope_cos[j + 1]))
                                 : make_float2(rope_second(y.x, x.x, rope_sin[j], rope_cos[j]),
                                               rope_second(y.y, x.y, rope_sin[j + 1], rope_cos[j + 1]));
          const __nv_bfloat162 rounded = __floats2bfloat162_rn(r.x, r.y);  // exact: both are BF16 values
          word = *reinterpret_cast<const uint32_t*>(&rounded);
        }
        if constexpr (kFp8) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
          word = pack2<true>(f.x, f.y);
        }
        qa[(4 * v + w) / 2][w % 2] = word;
      }
    }
  }
  if (rope) __syncthreads();  // the new key and value in the cache before any warp reads them
  float m = -FLT_MAX, l = 0.0f;  // this warp's softmax state for head g
  float acc[8][4] = {};          // Oᵀ m-tile i: dims of rows g and g + 8, heads 2t and 2t + 1

  for (int i = warp; i < tiles; i += kWarps) {
    const int tile = begin + i * kWarpKeys;
    if (!first_loaded) load_tile(tile);
    first_loaded = false;

    // S = Q · Kᵀ: sc[c] = {head g: keys 8c + 2t, +1}, {rows g + 8: unused}.
    float sc[4][4] = {};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t kw[16];
#pragma unroll
      for (int v = 0; v < kKVecs; ++v) {
        kw[4 * v] = k_raw[c][v].x, kw[4 * v + 1] = k_raw[c][v].y, kw[4 * v + 2] = k_raw[c][v].z;
        kw[4 * v + 3] = k_raw[c][v].w;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t b[2];
        if constexpr (kFp8) {
          b[0] = fp8x2_to_f16x2(kw[j]), b[1] = fp8x2_to_f16x2(kw[j] >> 16);
        } else {
          b[0] = kw[2 * j], b[1] = kw[2 * j + 1];
        }
        const uint32_t af[4] = {qa[j][0], 0u, qa[j][1], 0u};
        mma<kFp8>(sc[c], af, b);
      }
    }
    // Online softmax for head g over the tile's 32 keys (the four lanes of the group share them).
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float x = sc[c][i] * a.q_scale;
        if (a.logit_softcap > 0.0f) x = a.logit_softcap * tanhf(x / a.logit_softcap);
        sc[c][i] = tile + 8 * c + 2 * t + i < end ? x : -INFINITY;
        mx = fmaxf(mx, sc[c][i]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
    const float m_new = fmaxf(m, mx), alpha = __expf(m - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int i = 0; i < 2; ++i) sum += sc[c][i] = __expf(sc[c][i] - m_new);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
    l = l * alpha + sum;
    m = m_new;
    // Oᵀ's columns are heads 2t and 2t + 1: their rescale factors come from those heads' lanes.
    const float alpha_lo = __shfl_sync(0xFFFFFFFFu, alpha, 8 * t), alpha_hi = __shfl_sync(0xFFFFFFFFu, alpha, 8 * t + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      acc[i][0] *= alpha_lo, acc[i][2] *= alpha_lo;
      acc[i][1] *= alpha_hi, acc[i][3] *= alpha_hi;
    }
    // Oᵀ += Vᵀ · Pᵀ, k-step u over keys 16u .. 16u + 15.
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const uint32_t pb[2] = {pack2<kFp8>(sc[2 * u][0], sc[2 * u][1]), pack2<kFp8>(sc[2 * u + 1][0], sc[2 * u + 1][1])};
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        // pairs[e2][d]: dim 32b + 4g + d of keys (2t, 2t + 1) for e2 = 0, (2t + 8, 2t + 9) for e2 = 1.
        uint32_t pairs[2][4];
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const VWord w0 = v_raw[u][2 * e2][b], w1 = v_raw[u][2 * e2 + 1][b];
          if constexpr (kFp8) {
            const uint32_t d01 = __byte_perm(w0, w1, 0x5140), d23 = __byte_perm(w0, w1, 0x7362);
            pairs[e2][0] = fp8x2_to_f16x2(d01), pairs[e2][1] = fp8x2_to_f16x2(d01 >> 16);
            pairs[e2][2] = fp8x2_to_f16x2(d23), pairs[e2][3] = fp8x2_to_f16x2(d23 >> 16);
          } else {
            pairs[e2][0] = __byte_perm(w0.x, w1.x, 0x5410), pairs[e2][1] = __byte_perm(w0.x, w1.x, 0x7632);
            pairs[e2][2] = __byte_perm(w0.y, w1.y, 0x5410), pairs[e2][3] = __byte_perm(w0.y, w1.y, 0x7632);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // m-tile 2b + h: rows g and g + 8 are dims 2h and 2h + 1
          const uint32_t af[4] = {pairs[0][2 * h], pairs[0][2 * h + 1], pairs[1][2 * h], pairs[1][2 * h + 1]};
          mma<kFp8>(acc[2 * b + h], af, pb);
        }
      }
    }
  }

  // Merge the four warps' slices of this block's keys and write the block's slice.
  if (t == 0 && g < G) m_w[warp][g] = m, l_w[warp][g] = l;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int head = 2 * t + (r & 1), dim = 32 * (i / 2) + 4 * g + 2 * (i % 2) + (r >> 1);
      if (head < G) acc_w[warp][head][dim] = acc[i][r];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < G * kHeadDim; i += kThreads) {
    const int h = i / kHeadDim, d = i % kHeadDim;
    float mm = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, m_w[w][h]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = __expf(m_w[w][h] - mm);
      num += f * acc_w[w][h][d];
      den += f * l_w[w][h];
    }
    if constexpr (kClusterMerge) {
      slice_acc[h][d] = num;
      if (d == 0) slice_m[h] = den > 0.0f ? mm : -FLT_MAX, slice_l[h] = den;
    } else {
      const int64_t part = (int64_t{s} * a.heads + int64_t{kh} * G + h) * a.splits + sp;
      a.part_acc[part * kHeadDim + d] = num;
      if (d == 0) {
        a.part_ml[2 * part] = den > 0.0f ? mm : -FLT_MAX;
        a.part_ml[2 * part + 1] = den;
      }
    }
  }
  if constexpr (kClusterMerge) {
    // Block r of the cluster merges the outputs r, r + C, ... of the group's (head, dim) pairs over every
    // block's slice, as merge_kernel does.
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every slice in its block's shared memory
    const int C = static_cast<int>(cluster.num_blocks()), r = static_cast<int>(cluster.block_rank());
    for (int i = r * kThreads + threadIdx.x; i < G * kHeadDim; i += C * kThreads) {
      const int h = i / kHeadDim, d = i % kHeadDim;
      // Every block's (m, l, acc) asked for at once: the distributed shared memory reads overlap
      // rather than wait one on another.
      float ms[kMaxClusterSlices], ls[kMaxClusterSlices], accs[kMaxClusterSlices];
#pragma unroll
      for (int b = 0; b < kMaxClusterSlices; ++b)
        if (b < C) {
          ms[b] = *cluster.map_shared_rank(&slice_m[h], b);
          ls[b] = *cluster.map_shared_rank(&slice_l[h], b);
          accs[b] = *cluster.map_shared_rank(&slice_acc[h][d], b);
        }
      float mm = -FLT_MAX;
#pragma unroll
      for (int b = 0; b < kMaxClusterSlices; ++b)
        if (b < C) mm = fmaxf(mm, ms[b]);
      float num = 0.0f, den = 0.0f;
#pragma unroll
      for (int b = 0; b < kMaxClusterSlices; ++b)
        if (b < C && ls[b] != 0.0f) {
          const float w = __expf(ms[b] - mm);
          num += w * accs[b];
          den += w * ls[b];
        }
      a.out[int64_t{s} * a.heads * kHeadDim + (int64_t{kh} * G + h) * kHeadDim + d] =
          __float2bfloat16_rn(den > 0.0f ? num / den * a.v_scale : 0.0f);
    }
    cluster.sync();  // no block leaves while another reads its shared memory
  }
}

// Keys a slice holds a multiple of: a block's four warps take 32-key tiles in turn, so a slice of
// 4·32·n keys gives each warp n tiles, where a slice of 142 keys (Mixtral, batch 32, 1280 keys in 9
// slices) left warp 0 two tiles and the others one. NIBBLE_DECODE_CHUNK_KEYS (a multiple of 32)
// overrides it (tuning).
int chunk_align() {
  static const int align = [] {
    const char* v = std::getenv("NIBBLE_DECODE_CHUNK_KEYS");
    const int keys = v != nullptr && *v != '\0' ? std::atoi(v) : kWarps * kWarpKeys;
    check(keys >= kWarpKeys && keys % kWarpKeys == 0, "NIBBLE_DECODE_CHUNK_KEYS must be a multiple of ", kWarpKeys);
    return keys;
  }();
  return align;
}

// One block per (sequence, query head): merges the slices.
__global__ void __launch_bounds__(kHeadDim) merge_kernel(const __grid_constant__ DecodeArgs a) {
  const int s = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  ptx::dependency_wait(a.trigger_first);
  const int64_t part0 = (int64_t{s} * a.heads + h) * a.splits;
  float m = -FLT_MAX;
  for (int sp = 0; sp < a.splits; ++sp) m = fmaxf(m, a.part_ml[2 * (part0 + sp)]);
  float num = 0.0f, den = 0.0f;
  for (int sp = 0; sp < a.splits; ++sp) {
    const float l = a.part_ml[2 * (part0 + sp) + 1];
    if (l == 0.0f) continue;
    const float w = __expf(a.part_ml[2 * (part0 + sp)] - m);
    num += w * a.part_acc[(part0 + sp) * kHeadDim + d];
    den += w * l;
  }
  a.out[int64_t{s} * a.heads * kHeadDim + int64_t{h} * kHeadDim + d] =
      __float2bfloat16_rn(den > 0.0f ? num / den * a.v_scale : 0.0f);
}

// How the slices merge (decode_kernel's kClusterMerge or merge_kernel): NIBBLE_DECODE_MERGE=cluster or
// kernel; by default the cluster, for contexts up to kClusterMaxKeys, where the clustered grid is one
// wave of block slots (decode_grid), else merge_kernel.
constexpr int64_t kClusterMaxKeys = 8192;
enum class Merge { kKernel, kCluster };
std::optional<Merge> merge_setting() {  // none: by the rule of decode_grid
  static const std::optional<Merge> setting = []() -> std::optional<Merge> {
    const std::string name = env_choice("NIBBLE_DECODE_MERGE", {"cluster", "kernel"});
    if (name.empty()) return std::nullopt;
    return name == "cluster" ? Merge::kCluster : Merge::kKernel;
  }();
  return setting;
}

// The decode kernel of a launch: FP8 or BF16 cache, the slices merged in their cluster or by merge_kernel.
using DecodeKernel = void (*)(DecodeArgs);
DecodeKernel decode_kernel_for(bool fp8, bool cluster) {
  if (fp8) return cluster ? decode_kernel<true, true> : decode_kernel<true, false>;
  return cluster ? decode_kernel<false, true> : decode_kernel<false, false>;
}

// The most slices a cluster of the cluster-merge kernel takes on this device: 16 (a non-portable
// cluster size) where the device can hold such a cluster, else 8.
int max_cluster_slices(bool fp8) {
  static std::mutex mutex;
  static std::map<std::pair<int, bool>, int> slices;  // (device, fp8)
  int device = 0;
  cuda_check(cudaGetDevice(&device));
  std::lock_guard lock(mutex);
  auto [it, fresh] = slices.try_emplace({device, fp8}, 8);
  if (fresh) {
    const DecodeKernel kernel = decode_kernel_for(fp8, true);
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kMaxClusterSlices, 1, 1);
    config.blockDim = dim3(kThreads, 1, 1);
    cudaLaunchAttribute cluster = cluster_shape(kMaxClusterSlices);
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) == cudaSuccess && clusters > 0)
      it->second = kMaxClusterSlices;
    cudaGetLastError();  // a refused query leaves its error behind
  }
  return it->second;
}

// The launch for a batch: splits of each sequence's keys, whether they merge in a cluster, and the grid's
// blocks against the device's block slots. Splits aim at about two waves of slots (a second wave evens
// out SMs that hold more blocks than others). The cluster merge wins only where its grid is one wave:
// measured on an H200 (bench/RESULTS.md, fourteenth session, CudaOpsTwin.DecodeAttentionTiming, 1025
// keys, µs a call, cluster / kernel), batch 1 Mixtral-8x7B 10.5 / 13.0 and Grok-1 12.9 / 15.5, batch 32
// Grok-1 100.4 / 53.2 (a second wave of clusters, 16 blocks each, waits on the first whole). Not kept
// (seventeenth session, the engine's bucket of 4 sequences, Mixtral-8x7B, ms a step, A/B in one call):
// 8 slices a pair in the cluster where 16 overflow one wave (256 blocks) took batch 4 in 6.36 against
// 6.51 with merge_kernel, but batch 3 (the same graph, a row of padding) in 6.32 against 6.20-6.22.
struct DecodeGrid {
  int splits;
  bool cluster;
  int64_t blocks, slots;
};
// NIBBLE_DECODE_WAVES (tuning) overrides the two waves.
int64_t decode_waves() {
  static const int64_t waves = [] {
    const char* v = std::getenv("NIBBLE_DECODE_WAVES");
    const int n = v != nullptr && *v != '\0' ? std::atoi(v) : 2;
    check(n >= 1 && n <= 16, "NIBBLE_DECODE_WAVES must be 1 to 16");
    return int64_t{n};
  }();
  return waves;
}

DecodeGrid decode_grid(const ForwardBatch& batch, const AttentionParams& params, bool fp8) {
  int per_sm = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_kernel_for(fp8, false), kThreads, 0));
  const int64_t slots = int64_t{std::max(per_sm, 1)} * multiprocessor_count();
  const int64_t pairs = batch.num_seqs * params.num_kv_heads, aim = decode_waves() * slots;
  int splits = static_cast<int>(std::clamp<int64_t>((aim + pairs - 1) / pairs, 1, kMaxSplits));
  const std::optional<Merge> setting = merge_setting();
  if (setting == Merge::kCluster || (!setting && batch.max_seq_len <= kClusterMaxKeys)) {
    const int clustered = std::min(splits, max_cluster_slices(fp8));
    if (setting == Merge::kCluster || clustered * pairs <= slots)
      return {.splits = clustered, .cluster = true, .blocks = clustered * pairs, .slots = slots};
  }
  return {.splits = splits, .cluster = false, .blocks = splits * pairs, .slots = slots};
}

}  // namespace

bool attention_decode_appends(const ForwardBatch& batch, const AttentionParams& params, KvCacheDType cache_dtype) {
  static const int setting = [] {
    const std::string name = env_choice("NIBBLE_DECODE_APPEND", {"auto", "decode", "kernel"});
    return name == "decode" ? 1 : name == "kernel" ? 0 : -1;
  }();
  if (setting >= 0) return setting == 1;
  const DecodeGrid grid = decode_grid(batch, params, cache_dtype == KvCacheDType::kFp8E4M3);
  return grid.blocks <= grid.slots;
}

bool attention_decode_supported(const ForwardBatch& batch, const AttentionParams& params) {
  return batch.max_query_len == 1 && batch.num_tokens == batch.num_seqs && params.head_dim == kHeadDim &&
         params.num_kv_heads > 0 && params.num_heads % params.num_kv_heads == 0 &&
         params.num_heads / params.num_kv_heads <= kMaxGroup;
}

void attention_decode(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
                      const AttentionParams& params, Tensor& out, cudaStream_t stream, const Tensor* inv_freq) {
  check(attention_decode_supported(batch, params), "attention_decode: unsupported batch or head layout");
  const int64_t S = batch.num_seqs, Hq = params.num_heads;
  if (S == 0) return;
  const bool fp8 = cache_dtype == KvCacheDType::kFp8E4M3;
  const auto [splits, cluster, blocks, slots] = decode_grid(batch, params, fp8);
  Tensor part_acc = cluster ? Tensor() : empty(DType::kF32, {S, Hq, splits, kHeadDim});
  Tensor part_ml = cluster ? Tensor() : empty(DType::kF32, {S, Hq, splits, 2});
  const DecodeArgs a{.qkv = qkv.data<bf16>(), .k_cache = cache.k.raw(), .v_cache = cache.v.raw(),
                     .block_tables = batch.block_tables.data<int32_t>(), .seq_lens = batch.seq_lens.data<int32_t>(),
                     .part_acc = cluster ? nullptr : part_acc.data<float>(),
                     .part_ml = cluster ? nullptr : part_ml.data<float>(), .out = out.data<bf16>(),
                     .width = qkv.dim(1), .max_blocks = batch.block_tables.dim(1), .block_size = static_cast<int>(cache.k.dim(1)),
                     .heads = static_cast<int>(Hq), .kv_heads = static_cast<int>(params.num_kv_heads),
                     .group = static_cast<int>(Hq / params.num_kv_heads), .splits = splits,
                     .chunk_align = chunk_align(),
                     .q_scale = params.softmax_scale * (fp8 ? params.k_scale : 1.0f),
                     .logit_softcap = params.logit_softcap, .v_scale = fp8 ? params.v_scale : 1.0f,
                     .inv_freq = inv_freq != nullptr ? inv_freq->data<float>() : nullptr,
                     .positions = batch.positions.data<int32_t>(), .slot_mapping = batch.slot_mapping.data<int32_t>(),
                     .k_store = cache.k.raw(), .v_store = cache.v.raw(), .k_store_scale = params.k_scale,
                     .v_store_scale = params.v_scale, .trigger_first = trigger_first(kTriggerAttention)};
  const DecodeKernel kernel = decode_kernel_for(fp8, cluster);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(params.num_kv_heads), static_cast<unsigned>(S));
  if (cluster) {
    launch_kernel_with({cluster_shape(static_cast<unsigned>(splits))}, kernel, grid, kThreads, 0, stream, a);
    return cuda_check(cudaGetLastError());
  }
  launch_kernel(kernel, grid, kThreads, 0, stream, a);
  cuda_check(cudaGetLastError());
  launch_kernel(merge_kernel, dim3(static_cast<unsigned>(S), static_cast<unsigned>(Hq)), kHeadDim, 0, stream, a);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
