// Split-KV paged decode attention (attention_decode.h).
#include "cuda/attention_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>

#include "cuda/cuda_check.h"
#include "cuda/device.h"

namespace nibble::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kHeadDim = 128;
constexpr int kThreads = 128;  // one key per thread when scoring; 4 warps × 32 lanes × 4 dims when summing V
constexpr int kTile = 128;     // keys per tile
constexpr int kMaxGroup = 8;   // query heads per KV head
constexpr int kMaxSplits = 32;

struct DecodeArgs {
  const bf16* qkv;             // (S, width)
  const void* k_cache;         // (blocks, block_size, kv_heads, D)
  const void* v_cache;
  const int32_t* block_tables;  // (S, max_blocks)
  const int32_t* seq_lens;      // (S)
  float* part_acc;             // (S, Hq, splits, D): Σ p·v of each slice, unnormalized
  float* part_ml;              // (S, Hq, splits, 2): running max and Σ p of each slice
  bf16* out;                   // (S, Hq·D)
  int64_t width, max_blocks, block_size;
  int heads, kv_heads, group, splits;
  float q_scale, logit_softcap, v_scale;
};

// Four KV elements as floats.
template <bool kFp8>
__device__ inline void load4(const void* base, int64_t index, float (&v)[4]) {
  if constexpr (kFp8) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(base) + index);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw pair =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> (16 * h)), __NV_E4M3);
      const float2 f = __half22float2(__half2(pair));
      v[2 * h] = f.x;
      v[2 * h + 1] = f.y;
    }
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const bf16*>(base) + index);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  }
}

// Sixteen FP8 values (one 16-byte load) as floats.
__device__ inline void fp8x16_to_float(const uint4 raw, float (&v)[16]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw pair =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h)), __NV_E4M3);
      const float2 f = __half22float2(__half2(pair));
      v[4 * w + 2 * h] = f.x;
      v[4 * w + 2 * h + 1] = f.y;
    }
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads) decode_kernel(const __grid_constant__ DecodeArgs a) {
  constexpr int kElemBytes = kFp8 ? 1 : 2;
  constexpr int kRowVecs = kHeadDim * kElemBytes / 16;     // 16-byte vectors in one key's row
  constexpr int kTileVecs = kTile * kRowVecs / kThreads;  // 16-byte V loads a thread makes per tile
  __shared__ float q_s[kMaxGroup][kHeadDim];
  __shared__ float p_s[kMaxGroup][kTile];
  __shared__ int64_t slot_s[kTile];
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup], alpha_s[kMaxGroup];
  // The tile's V rows while summing; the four warps' partial sums at the end.
  __shared__ union {
    uint4 v[kTile * kRowVecs];
    float acc[kThreads / 32][kMaxGroup][kHeadDim];
  } buf;
  const int sp = blockIdx.x, kh = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32, G = a.group;
  const int len = a.seq_lens[s];
  const int chunk = (len + a.splits - 1) / a.splits;
  const int begin = sp * chunk, end = min(len, begin + chunk);
  const int64_t kv_width = int64_t{a.kv_heads} * kHeadDim;

  for (int i = tid; i < G * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim, d = i % kHeadDim;
    q_s[g][d] = __bfloat162float(a.qkv[s * a.width + (int64_t{kh} * G + g) * kHeadDim + d]) * a.q_scale;
  }
  if (tid < G) m_s[tid] = -FLT_MAX, l_s[tid] = 0.0f;
  float acc[kMaxGroup][4];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;
  __syncthreads();

  const int32_t* table = a.block_tables + s * a.max_blocks;
  for (int tile = begin; tile < end; tile += kTile) {
    const int j = tile + tid, count = min(kTile, end - tile);
    // Scores: thread tid scores key j against the group's query heads, its row in 16-byte loads.
    if (j < end) {
      const int64_t slot = int64_t{table[j / a.block_size]} * a.block_size + j % a.block_size;
      slot_s[tid] = slot;
      const auto* row = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.k_cache) +
                                                       (slot * kv_width + int64_t{kh} * kHeadDim) * kElemBytes);
      uint4 raw[kRowVecs];
#pragma unroll
      for (int v = 0; v < kRowVecs; ++v) raw[v] = row[v];
      float dot[kMaxGroup] = {};
#pragma unroll
      for (int v = 0; v < kRowVecs; ++v) {
        float k[16];
        if constexpr (kFp8) {
          fp8x16_to_float(raw[v], k);
        } else {
          const uint32_t words[4] = {raw[v].x, raw[v].y, raw[v].z, raw[v].w};
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
            k[2 * w] = f.x, k[2 * w + 1] = f.y;
          }
        }
        constexpr int kPer = 16 / kElemBytes;  // values in one vector
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= G) break;
#pragma unroll
          for (int i = 0; i < kPer; ++i) dot[g] += q_s[g][v * kPer + i] * k[i];
        }
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < G) p_s[g][tid] = a.logit_softcap > 0.0f ? a.logit_softcap * tanhf(dot[g] / a.logit_softcap) : dot[g];
    } else {
      for (int g = 0; g < G; ++g) p_s[g][tid] = -FLT_MAX;
    }
    __syncthreads();
    // The tile's V rows: every load in flight at once, kept in registers through the softmax.
    uint4 v_regs[kTileVecs] = {};
#pragma unroll
    for (int i = 0; i < kTileVecs; ++i) {
      const int idx = i * kThreads + tid, key = idx / kRowVecs, part = idx % kRowVecs;
      if (key < count)
        v_regs[i] = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.v_cache) +
                                                   (slot_s[key] * kv_width + int64_t{kh} * kHeadDim) * kElemBytes)[part];
    }
    // Online softmax per head: warp w owns heads w, w + 4, ...
    for (int g = warp; g < G; g += kThreads / 32) {
      float x[kTile / 32], mx = -FLT_MAX;
#pragma unroll
      for (int i = 0; i < kTile / 32; ++i) mx = fmaxf(mx, x[i] = p_s[g][lane + 32 * i]);
      for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
      const float m_old = m_s[g], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kTile / 32; ++i) {
        const float p = lane + 32 * i < count ? __expf(x[i] - m_new) : 0.0f;
        p_s[g][lane + 32 * i] = p;
        sum += p;
      }
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
      __syncwarp();
      if (lane == 0) {
        const float alpha = __expf(m_old - m_new);
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
#pragma unroll
    for (int i = 0; i < kTileVecs; ++i)
      if ((i * kThreads + tid) / kRowVecs < count) buf.v[i * kThreads + tid] = v_regs[i];
    __syncthreads();
    // Σ p·v: warp w takes keys w, w + 4, ...; lane owns dims 4·lane .. 4·lane + 3.
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= G) break;
      const float alpha = alpha_s[g];
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[g][i] *= alpha;
    }
    const auto* v_bytes = reinterpret_cast<const uint8_t*>(buf.v);
#pragma unroll 4
    for (int jj = warp; jj < count; jj += kThreads / 32) {
      float v[4];
      load4<kFp8>(v_bytes + int64_t{jj} * kHeadDim * kElemBytes, 4 * lane, v);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= G) break;
        const float p = p_s[g][jj];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[g][i] += p * v[i];
      }
    }
    __syncthreads();
  }

  // Sum the four warps' partial Σ p·v and write this slice.
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G)
#pragma unroll
      for (int i = 0; i < 4; ++i) buf.acc[warp][g][4 * lane + i] = acc[g][i];
  __syncthreads();
  for (int i = tid; i < G * kHeadDim; i += kThreads) {
    const int g = i / kHeadDim, d = i % kHeadDim;
    const int64_t part = (int64_t{s} * a.heads + int64_t{kh} * G + g) * a.splits + sp;
    a.part_acc[part * kHeadDim + d] = buf.acc[0][g][d] + buf.acc[1][g][d] + buf.acc[2][g][d] + buf.acc[3][g][d];
    if (d == 0) {
      a.part_ml[2 * part] = begin < end ? m_s[g] : -FLT_MAX;
      a.part_ml[2 * part + 1] = begin < end ? l_s[g] : 0.0f;
    }
  }
}

// One block per (sequence, query head): merges the slices.
__global__ void __launch_bounds__(kHeadDim) merge_kernel(const __grid_constant__ DecodeArgs a) {
  const int s = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
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

}  // namespace

bool attention_decode_supported(const ForwardBatch& batch, const AttentionParams& params) {
  return batch.max_query_len == 1 && batch.num_tokens == batch.num_seqs && params.head_dim == kHeadDim &&
         params.num_kv_heads > 0 && params.num_heads % params.num_kv_heads == 0 &&
         params.num_heads / params.num_kv_heads <= kMaxGroup;
}

void attention_decode(const Tensor& qkv, const KvCacheLayer& cache, KvCacheDType cache_dtype,
                      const ForwardBatch& batch, const AttentionParams& params, Tensor& out, cudaStream_t stream) {
  check(attention_decode_supported(batch, params), "attention_decode: unsupported batch or head layout");
  const int64_t S = batch.num_seqs, Hq = params.num_heads;
  if (S == 0) return;
  const bool fp8 = cache_dtype == KvCacheDType::kFp8E4M3;
  // Split each sequence's keys so that the grid fills every block slot of the device once.
  int per_sm = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, fp8 ? decode_kernel<true> : decode_kernel<false>, kThreads, 0));
  const int64_t slots = int64_t{std::max(per_sm, 1)} * multiprocessor_count();
  const int splits = static_cast<int>(std::clamp<int64_t>(slots / (S * params.num_kv_heads), 1, kMaxSplits));
  Tensor part_acc = empty(DType::kF32, {S, Hq, splits, kHeadDim});
  Tensor part_ml = empty(DType::kF32, {S, Hq, splits, 2});
  const DecodeArgs a{.qkv = qkv.data<bf16>(), .k_cache = cache.k.raw(), .v_cache = cache.v.raw(),
                     .block_tables = batch.block_tables.data<int32_t>(), .seq_lens = batch.seq_lens.data<int32_t>(),
                     .part_acc = part_acc.data<float>(), .part_ml = part_ml.data<float>(), .out = out.data<bf16>(),
                     .width = qkv.dim(1), .max_blocks = batch.block_tables.dim(1), .block_size = cache.k.dim(1),
                     .heads = static_cast<int>(Hq), .kv_heads = static_cast<int>(params.num_kv_heads),
                     .group = static_cast<int>(Hq / params.num_kv_heads), .splits = splits,
                     .q_scale = params.softmax_scale * (fp8 ? params.k_scale : 1.0f),
                     .logit_softcap = params.logit_softcap, .v_scale = fp8 ? params.v_scale : 1.0f};
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(params.num_kv_heads), static_cast<unsigned>(S));
  if (fp8)
    decode_kernel<true><<<grid, kThreads, 0, stream>>>(a);
  else
    decode_kernel<false><<<grid, kThreads, 0, stream>>>(a);
  cuda_check(cudaGetLastError());
  merge_kernel<<<dim3(static_cast<unsigned>(S), static_cast<unsigned>(Hq)), kHeadDim, 0, stream>>>(a);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
