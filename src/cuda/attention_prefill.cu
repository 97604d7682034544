// Causal paged prefill attention on the tensor cores (attention_prefill.h). Not the decode path: one
// token per sequence goes to attention_decode, whose split-KV launch suits it better.
#include "cuda/attention_prefill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/attention_mma.cuh"
#include "cuda/cuda_check.h"
#include "cuda/kernel_attributes.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

using attention_mma::fp8x2_to_f16x2;
using attention_mma::mma;
using attention_mma::pack2;
using ptx::ldmatrix_x4;
using ptx::ldmatrix_x4_trans;

using bf16 = __nv_bfloat16;
constexpr int kHeadDim = 128;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // query rows a block: 16 a warp, the MMA's m
constexpr int kKeys = 64;           // keys a tile
constexpr int kMinBlocks = 2;       // blocks an SM (3 would cap registers at 168 and spill)
constexpr int kChunks = kHeadDim * 2 / 16;  // 16-byte chunks of a key row in 16-bit values
constexpr int kTile16 = kKeys * kHeadDim * 2;  // bytes of a K or V tile in 16-bit values
constexpr float kLog2e = 1.4426950408889634f;

struct PrefillArgs {
  const bf16* qkv;              // (T, width): q of head h at columns h·D
  const void* k_cache;          // (blocks, block_size, kv_heads, D), e4m3 or bf16
  const void* v_cache;          // same
  const int32_t* positions;     // (T)
  const int32_t* query_start;   // (S + 1)
  const int32_t* block_tables;  // (S, max_blocks)
  bf16* out;                    // (T, Hq·D)
  int64_t width, max_blocks;
  int block_size, heads, kv_heads, group;
  // Scores in the log2 domain: s·score_scale without the soft-cap, cap_log2e·tanh(s·score_scale) with it.
  float score_scale, cap_log2e, v_scale;
};

// Shared memory: two stages of (K, V) tiles as the cache stores them (e4m3 rows of 128 bytes in order,
// or bf16 rows swizzled as below), then for an FP8 cache the current tile widened to f16, swizzled.
template <bool kFp8>
constexpr int kStageBytes = 2 * kKeys * kHeadDim * (kFp8 ? 1 : 2);
template <bool kFp8>
constexpr int kSmemBytes = 2 * kStageBytes<kFp8> + (kFp8 ? 2 * kTile16 : 0);

// Byte offset of 16-byte chunk `chunk` of key row `key` in a 16-bit tile: the chunk index is XORed with
// the row so that the eight rows one ldmatrix phase reads fall in eight different bank groups.
__device__ inline int swizzle(int key, int chunk) { return (key * kChunks + (chunk ^ (key & 7))) * 16; }

// Starts copying keys [key0, key0 + kKeys) of KV head kh into a stage; keys at or past `end` are zeros
// (a finite V, so that their zero weights stay zero).
template <bool kFp8>
__device__ inline void load_tile(const PrefillArgs& a, const int32_t* table, int kh, int key0, int end,
                                 uint8_t* k_dst, uint8_t* v_dst) {
  constexpr int kElemBytes = kFp8 ? 1 : 2, kRowChunks = kHeadDim * kElemBytes / 16;
  const auto* k_src = static_cast<const uint8_t*>(a.k_cache);
  const auto* v_src = static_cast<const uint8_t*>(a.v_cache);
#pragma unroll
  for (int it = 0; it < kKeys * kRowChunks / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = i / kRowChunks, chunk = i % kRowChunks, key = key0 + r;
    const bool valid = key < end;
    const int64_t slot = valid ? int64_t{table[key / a.block_size]} * a.block_size + key % a.block_size : 0;
    const int64_t src = ((slot * a.kv_heads + kh) * kHeadDim * kElemBytes) + chunk * 16;
    const int dst = kFp8 ? i * 16 : swizzle(r, chunk);
    ptx::cp_async_16(k_dst + dst, k_src + src, valid);
    ptx::cp_async_16(v_dst + dst, v_src + src, valid);
  }
}

// An e4m3 tile (kKeys rows of 128 bytes, in order) as f16, swizzled; exact.
__device__ inline void widen_tile(const uint8_t* src, uint8_t* dst) {
#pragma unroll
  for (int it = 0; it < kKeys * kChunks / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    const uint2 raw = *reinterpret_cast<const uint2*>(src + i * 8);
    const uint4 w = make_uint4(fp8x2_to_f16x2(raw.x), fp8x2_to_f16x2(raw.x >> 16), fp8x2_to_f16x2(raw.y),
                               fp8x2_to_f16x2(raw.y >> 16));
    *reinterpret_cast<uint4*>(dst + swizzle(i / kChunks, i % kChunks)) = w;
  }
}

// Rows of a block: flat row r of sequence s's group on KV head kh is token r / G, query head kh·G + r % G;
// the block takes rows [64·tile, 64·tile + 64), warp w rows 16w..16w + 15 of them. Per key tile each warp
// computes S (16 × 64) = Q (16 × 128) · Kᵀ, turns S into P with its rows' online softmax, and adds
// P · V (64 × 128) to O (16 × 128); S leaves the first MMA in the register layout the second reads as
// its A operand. Thread (g = lane / 4, t = lane % 4) holds rows g and g + 8 of the warp's 16.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, kMinBlocks) prefill_kernel(const __grid_constant__ PrefillArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int s = blockIdx.z, kh = blockIdx.y;
  const int q0 = a.query_start[s], G = a.group, rows = (a.query_start[s + 1] - q0) * G;
  const int tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // the tiles with the most keys first
  if (tile * kRows >= rows) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int32_t* table = a.block_tables + s * a.max_blocks;
  auto position = [&](int row) { return a.positions[q0 + min(row, rows - 1) / G]; };  // rows past the end: the last
  const int end = position(tile * kRows + kRows - 1) + 1;                              // keys this block sees
  const int warp_row = tile * kRows + 16 * warp;
  const int warp_first = position(warp_row), warp_last = position(warp_row + 15);
  const int pos[2] = {position(warp_row + g), position(warp_row + g + 8)};

  constexpr int kHalfStage = kStageBytes<kFp8> / 2;  // a stage: K then V
  load_tile<kFp8>(a, table, kh, 0, end, smem, smem + kHalfStage);
  ptx::cp_async_commit();

  // Q as A fragments, k-step j: {row g: dims 16j + 2t, +1}, {row g + 8: same}, {row g: + 8}, {row g + 8: + 8}.
  uint32_t qa[8][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = min(warp_row + g + 8 * h, rows - 1);
    const bf16* q = a.qkv + int64_t{q0 + row / G} * a.width + int64_t{kh * G + row % G} * kHeadDim + 2 * t;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t word = *reinterpret_cast<const uint32_t*>(q + 16 * j + 8 * half);
        if constexpr (kFp8) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
          word = pack2<true>(f.x, f.y);
        }
        qa[j][2 * half + h] = word;
      }
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this thread's columns only, summed at the end
  float acc[16][4] = {};  // O's n-tile n: {row g: dims 8n + 2t, +1}, {row g + 8: same}
  const int key_tiles = (end + kKeys - 1) / kKeys;
  for (int kt = 0; kt < key_tiles; ++kt) {
    if (kt + 1 < key_tiles) {
      uint8_t* next = smem + (kt + 1) % 2 * kStageBytes<kFp8>;
      load_tile<kFp8>(a, table, kh, (kt + 1) * kKeys, end, next, next + kHalfStage);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();
    const uint8_t *ks = smem + kt % 2 * kStageBytes<kFp8>, *vs = ks + kHalfStage;
    if constexpr (kFp8) {
      uint8_t* wide = smem + 2 * kStageBytes<kFp8>;
      widen_tile(ks, wide);
      widen_tile(vs, wide + kTile16);
      __syncthreads();
      ks = wide, vs = wide + kTile16;
    }
    const int key0 = kt * kKeys;
    if (warp_row < rows && key0 <= warp_last) {  // else the warp has no rows, or they all precede the tile
      // S = Q · Kᵀ: sc[c] = {row g: keys 8c + 2t, +1}, {row g + 8: same}.
      float sc[8][4] = {};
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int c = 0; c < 8; c += 2) {
          // Matrices: keys 8c.. and 8(c + 1).. (lanes 16..31), dims 16j.. and 16j + 8.. (odd eighths).
          uint32_t b[4];
          ldmatrix_x4(b, ks + swizzle(8 * (c + lane / 16) + lane % 8, 2 * j + (lane / 8) % 2));
          mma<kFp8>(sc[c], qa[j], b[0], b[1]);
          mma<kFp8>(sc[c + 1], qa[j], b[2], b[3]);
        }
      // Online softmax of rows g and g + 8 over the tile's keys (the four lanes t share each row).
      const bool masked = key0 + kKeys - 1 > warp_first;
      if (a.cap_log2e > 0.0f) {  // one branch a tile, not one a score
#pragma unroll
        for (int c = 0; c < 8; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[c][e] = a.cap_log2e * tanhf(sc[c][e] * a.score_scale);
      } else {
#pragma unroll
        for (int c = 0; c < 8; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[c][e] *= a.score_scale;
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (masked && key0 + 8 * c + 2 * t + (e & 1) > pos[e / 2]) sc[c][e] = -INFINITY;
          mx[e / 2] = fmaxf(mx[e / 2], sc[c][e]);
        }
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 2));
        const float m_new = fmaxf(m[h], mx[h]);  // finite: key 0 is in every row's first tile
        alpha[h] = exp2f(m[h] - m_new);
        m[h] = m_new;
        l[h] *= alpha[h];
      }
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) l[e / 2] += sc[c][e] = exp2f(sc[c][e] - m[e / 2]);
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        acc[n][0] *= alpha[0], acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1], acc[n][3] *= alpha[1];
      }
      // O += P · V, k-step u over keys 16u .. 16u + 15.
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint32_t pa[4] = {pack2<kFp8>(sc[2 * u][0], sc[2 * u][1]), pack2<kFp8>(sc[2 * u][2], sc[2 * u][3]),
                                pack2<kFp8>(sc[2 * u + 1][0], sc[2 * u + 1][1]),
                                pack2<kFp8>(sc[2 * u + 1][2], sc[2 * u + 1][3])};
#pragma unroll
        for (int n = 0; n < 16; n += 2) {
          // Matrices (transposed): keys 16u.. and 16u + 8.. (odd eighths), dims 8n.. and 8(n + 1).. (lanes 16..31).
          uint32_t b[4];
          ldmatrix_x4_trans(b, vs + swizzle(16 * u + 8 * ((lane / 8) % 2) + lane % 8, n + lane / 16));
          mma<kFp8>(acc[n], pa, b[0], b[1]);
          mma<kFp8>(acc[n + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the stage read here is the one the next iteration refills
  }
  ptx::cp_async_wait<0>();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 1);
    l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 2);
    const int row = warp_row + g + 8 * h;
    if (row >= rows) continue;
    const float scale = a.v_scale / l[h];
    bf16* o = a.out + int64_t{q0 + row / G} * a.heads * kHeadDim + int64_t{kh * G + row % G} * kHeadDim + 2 * t;
#pragma unroll
    for (int n = 0; n < 16; ++n)
      *reinterpret_cast<__nv_bfloat162*>(o + 8 * n) =
          __floats2bfloat162_rn(acc[n][2 * h] * scale, acc[n][2 * h + 1] * scale);
  }
}

}  // namespace

bool attention_prefill_supported(const AttentionParams& params) {
  return params.head_dim == kHeadDim && params.num_kv_heads > 0 && params.num_heads % params.num_kv_heads == 0;
}

void attention_prefill(const Tensor& qkv, const KvCacheLayer& cache, KvCacheDType cache_dtype,
                       const ForwardBatch& batch, const AttentionParams& params, Tensor& out, cudaStream_t stream) {
  check(attention_prefill_supported(params), "attention_prefill: head_dim ", params.head_dim,
        " (needs 128) or heads ", params.num_heads, "/", params.num_kv_heads, " unsupported");
  if (batch.num_seqs == 0 || batch.max_query_len == 0) return;
  const bool fp8 = cache_dtype == KvCacheDType::kFp8E4M3;
  const int64_t group = params.num_heads / params.num_kv_heads;
  const float q_scale = params.softmax_scale * (fp8 ? params.k_scale : 1.0f);
  const bool capped = params.logit_softcap > 0.0f;
  const PrefillArgs a{.qkv = qkv.data<bf16>(), .k_cache = cache.k.raw(), .v_cache = cache.v.raw(),
                      .positions = batch.positions.data<int32_t>(), .query_start = batch.query_start.data<int32_t>(),
                      .block_tables = batch.block_tables.data<int32_t>(), .out = out.data<bf16>(),
                      .width = qkv.dim(1), .max_blocks = batch.block_tables.dim(1),
                      .block_size = static_cast<int>(cache.k.dim(1)),
                      .heads = static_cast<int>(params.num_heads), .kv_heads = static_cast<int>(params.num_kv_heads),
                      .group = static_cast<int>(group),
                      .score_scale = capped ? q_scale / params.logit_softcap : q_scale * kLog2e,
                      .cap_log2e = capped ? params.logit_softcap * kLog2e : 0.0f,
                      .v_scale = fp8 ? params.v_scale : 1.0f};
  // Row tiles of the longest sequence; the grid depends on max_query_len only (host-side in the batch).
  const int64_t tiles = (batch.max_query_len * group + kRows - 1) / kRows;
  check(tiles <= INT32_MAX && batch.num_seqs <= 65535, "attention_prefill: batch too large (", batch.num_seqs,
        " sequences, ", batch.max_query_len, " tokens)");
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(params.num_kv_heads),
                  static_cast<unsigned>(batch.num_seqs));
  if (fp8) {
    allow_dynamic_smem(reinterpret_cast<const void*>(prefill_kernel<true>), kSmemBytes<true>);
    launch_kernel(prefill_kernel<true>, grid, kThreads, kSmemBytes<true>, stream, a);
  } else {
    allow_dynamic_smem(reinterpret_cast<const void*>(prefill_kernel<false>), kSmemBytes<false>);
    launch_kernel(prefill_kernel<false>, grid, kThreads, kSmemBytes<false>, stream, a);
  }
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
