// Paged causal attention over a BF16 or FP8 KV cache (GQA, optional logit soft-cap): the KV append
// (inside the decode kernel on rope_attention's decode steps), then the split-KV decode kernel
// (attention_decode.h) when every sequence brings one token, else the tensor-core prefill kernel
// (attention_prefill.h) for head_dim 128, else the plain version: one block per (query token, head)
// scoring every cached key of its sequence, correct for any context the shared memory holds
// (positions up to 12288).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>

#include "cuda/attention_decode.h"
#include "cuda/attention_prefill.h"
#include "cuda/basic_ops.h"
#include "cuda/cuda_check.h"
#include "cuda/kv_store.cuh"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"
#include "cuda/rope.cuh"
#include "cuda/vec8.cuh"

namespace nibble::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 128;
constexpr int64_t kMaxContext = 12288;

struct AttentionArgs {
  const bf16* qkv;
  void* k_cache;
  void* v_cache;
  bool fp8;
  const int32_t* positions;
  const int32_t* query_start;
  const int32_t* block_tables;
  const int32_t* slot_mapping;
  bf16* out;
  int64_t num_seqs, max_blocks, block_size, heads, kv_heads, head_dim;
  float softmax_scale, k_scale, v_scale, logit_softcap;
};

__device__ inline float load_kv(const void* cache, bool fp8, int64_t index) {
  if (fp8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(cache)[index], __NV_E4M3);
    return __half2float(__half(h));
  }
  return __bfloat162float(static_cast<const bf16*>(cache)[index]);
}

__global__ void append_kv_kernel(const __grid_constant__ AttentionArgs p) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t t = blockIdx.x, kv_width = p.kv_heads * p.head_dim;
  const int64_t width = (p.heads + 2 * p.kv_heads) * p.head_dim;
  const int64_t slot = p.slot_mapping[t];
  for (int64_t i = threadIdx.x; i < kv_width; i += blockDim.x) {
    const float k = __bfloat162float(p.qkv[t * width + p.heads * p.head_dim + i]);
    const float v = __bfloat162float(p.qkv[t * width + p.heads * p.head_dim + kv_width + i]);
    store_kv(p.k_cache, p.fp8, p.k_scale, slot * kv_width + i, k);
    store_kv(p.v_cache, p.fp8, p.v_scale, slot * kv_width + i, v);
  }
}

// rope_kernel (basic_ops.cu) and append_kv_kernel in one launch. Grid (T, items / kRopeThreads), an
// item a thread: 8 rotated pairs of one of the token's q and k heads (in place in qkv, the same
// arithmetic as rope_kernel; a k head's rotated values, as stored in BF16, also go into the cache), or
// 8 elements of its v heads into the cache.
constexpr int kRopeThreads = 256;

__global__ void __launch_bounds__(kRopeThreads)
    rope_append_kv_kernel(const __grid_constant__ AttentionArgs p, bf16* qkv, const float* inv_freq) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t t = blockIdx.x, D = p.head_dim, half = D / 2, groups = half / kVec;
  const int64_t kv_width = p.kv_heads * D, width = (p.heads + 2 * p.kv_heads) * D;
  const int64_t rope_items = (p.heads + p.kv_heads) * groups, v_items = kv_width / kVec;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= rope_items + v_items) return;
  const int64_t slot = p.slot_mapping[t];
  bf16* row = qkv + t * width;
  if (i >= rope_items) {
    float v[kVec];
    load8(row + (p.heads + p.kv_heads) * D + (i - rope_items) * kVec, v);
    return store8_kv(p.v_cache, p.fp8, p.v_scale, slot * kv_width + (i - rope_items) * kVec, v);
  }
  const int64_t head = i / groups, j0 = i % groups * kVec;
  float x1[kVec], x2[kVec];  // the stored (BF16) values, which the cache gets
  rope_rotate8(row + head * D + j0, half, inv_freq + j0, static_cast<float>(p.positions[t]), x1, x2);
  if (head >= p.heads) {
    const int64_t at = slot * kv_width + (head - p.heads) * D + j0;
    store8_kv(p.k_cache, p.fp8, p.k_scale, at, x1);
    store8_kv(p.k_cache, p.fp8, p.k_scale, at + half, x2);
  }
}

__global__ void attention_kernel(const __grid_constant__ AttentionArgs p) {
  extern __shared__ float scores[];
  __shared__ float reduce[kThreads / 32];
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t t = blockIdx.x, h = blockIdx.y;
  int64_t s = 0;
  while (s + 1 < p.num_seqs && p.query_start[s + 1] <= t) ++s;
  const int64_t context = p.positions[t] + 1, kv_head = h / (p.heads / p.kv_heads);
  const int64_t width = (p.heads + 2 * p.kv_heads) * p.head_dim, kv_width = p.kv_heads * p.head_dim;
  const bf16* q = p.qkv + t * width + h * p.head_dim;
  const int32_t* blocks = p.block_tables + s * p.max_blocks;
  const float k_scale = p.fp8 ? p.k_scale : 1.0f, v_scale = p.fp8 ? p.v_scale : 1.0f;

  float local_max = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < context; j += blockDim.x) {
    const int64_t base = (blocks[j / p.block_size] * p.block_size + j % p.block_size) * kv_width + kv_head * p.head_dim;
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += __bfloat162float(q[d]) * load_kv(p.k_cache, p.fp8, base + d);
    scores[j] = dot * k_scale * p.softmax_scale;
    if (p.logit_softcap > 0.0f) scores[j] = p.logit_softcap * tanhf(scores[j] / p.logit_softcap);
    local_max = fmaxf(local_max, scores[j]);
  }
  for (int o = 16; o > 0; o /= 2) local_max = fmaxf(local_max, __shfl_xor_sync(0xFFFFFFFFu, local_max, o));
  if (threadIdx.x % 32 == 0) reduce[threadIdx.x / 32] = local_max;
  __syncthreads();
  float max_score = reduce[0];
  for (int w = 1; w < kThreads / 32; ++w) max_score = fmaxf(max_score, reduce[w]);
  __syncthreads();
  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < context; j += blockDim.x) local_sum += scores[j] = expf(scores[j] - max_score);
  for (int o = 16; o > 0; o /= 2) local_sum += __shfl_xor_sync(0xFFFFFFFFu, local_sum, o);
  if (threadIdx.x % 32 == 0) reduce[threadIdx.x / 32] = local_sum;
  __syncthreads();
  float sum = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) sum += reduce[w];
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < context; ++j) {
      const int64_t base = (blocks[j / p.block_size] * p.block_size + j % p.block_size) * kv_width + kv_head * p.head_dim;
      acc += scores[j] / sum * load_kv(p.v_cache, p.fp8, base + d);
    }
    p.out[t * p.heads * p.head_dim + h * p.head_dim + d] = __float2bfloat16_rn(acc * v_scale);
  }
}

// The KV append (with RoPE first when inv_freq is given: then qkv is written too, except on decode
// steps that the decode kernel rotates and appends itself), then attention.
void append_and_attend(const Tensor& qkv, const Tensor* inv_freq, KvCacheLayer& cache, KvCacheDType cache_dtype,
                       const ForwardBatch& batch, const AttentionParams& params, Tensor& out, cudaStream_t stream) {
  const int64_t width = (params.num_heads + 2 * params.num_kv_heads) * params.head_dim;
  expect(qkv, DType::kBF16, {batch.num_tokens, width}, "attention qkv");
  expect(out, DType::kBF16, {batch.num_tokens, params.num_heads * params.head_dim}, "attention output");
  if (batch.num_tokens == 0) return;
  const bool decode = attention_decode_supported(batch, params);
  const bool prefill = !decode && attention_prefill_supported(params);
  check(decode || prefill || batch.max_seq_len <= kMaxContext, "the plain CUDA attention handles contexts up to ",
        kMaxContext, " tokens");
  const AttentionArgs a{.qkv = qkv.data<bf16>(), .k_cache = cache.k.raw(), .v_cache = cache.v.raw(),
                        .fp8 = cache_dtype == KvCacheDType::kFp8E4M3, .positions = batch.positions.data<int32_t>(),
                        .query_start = batch.query_start.data<int32_t>(),
                        .block_tables = batch.block_tables.data<int32_t>(),
                        .slot_mapping = batch.slot_mapping.data<int32_t>(), .out = out.data<bf16>(),
                        .num_seqs = batch.num_seqs, .max_blocks = batch.block_tables.dim(1),
                        .block_size = cache.k.dim(1), .heads = params.num_heads, .kv_heads = params.num_kv_heads,
                        .head_dim = params.head_dim, .softmax_scale = params.softmax_scale,
                        .k_scale = params.k_scale, .v_scale = params.v_scale,
                        .logit_softcap = params.logit_softcap};
  if (inv_freq != nullptr) {
    expect(*inv_freq, DType::kF32, {params.head_dim / 2}, "rope inv_freq");
    if (decode && attention_decode_appends(batch, params, cache_dtype))
      return attention_decode(qkv, cache, cache_dtype, batch, params, out, stream, inv_freq);
    check(params.head_dim % (2 * kVec) == 0, "rope: head_dim ", params.head_dim, " is not a multiple of ", 2 * kVec);
    // Items a token: 8 rotated pairs of a q or k head, 8 elements of the v heads.
    const int64_t items = (params.num_heads + params.num_kv_heads) * (params.head_dim / 2 / kVec) +
                          params.num_kv_heads * params.head_dim / kVec;
    const dim3 grid(static_cast<unsigned>(batch.num_tokens),
                    static_cast<unsigned>((items + kRopeThreads - 1) / kRopeThreads));
    launch_kernel(rope_append_kv_kernel, grid, kRopeThreads, 0, stream, a, const_cast<bf16*>(a.qkv),
                  inv_freq->data<float>());
  } else {
    launch_kernel(append_kv_kernel, static_cast<unsigned>(batch.num_tokens), kThreads, 0, stream, a);
  }
  cuda_check(cudaGetLastError());
  if (decode) return attention_decode(qkv, cache, cache_dtype, batch, params, out, stream);
  if (prefill) return attention_prefill(qkv, cache, cache_dtype, batch, params, out, stream);
  const dim3 grid(static_cast<unsigned>(batch.num_tokens), static_cast<unsigned>(params.num_heads));
  launch_kernel(attention_kernel, grid, kThreads, batch.max_seq_len * sizeof(float), stream, a);
  cuda_check(cudaGetLastError());
}

}  // namespace

void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
               const AttentionParams& params, Tensor& out, cudaStream_t stream) {
  append_and_attend(qkv, nullptr, cache, cache_dtype, batch, params, out, stream);
}

void rope_attention(Tensor& qkv, const Tensor& inv_freq, KvCacheLayer& cache, KvCacheDType cache_dtype,
                    const ForwardBatch& batch, const AttentionParams& params, Tensor& out, cudaStream_t stream) {
  append_and_attend(qkv, &inv_freq, cache, cache_dtype, batch, params, out, stream);
}

}  // namespace nibble::cuda
