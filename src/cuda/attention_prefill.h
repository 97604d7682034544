// Causal paged prefill attention (sequences bringing one or more new tokens at the end of their
// context) over a BF16 or FP8 KV cache, flash-attention style on the tensor cores: each block takes one
// sequence, one KV head and 64 query rows (token, query head of the group), walks the keys up to its
// causal limit in 64-key tiles staged in shared memory, and keeps an online softmax per row. head_dim
// 128 only; no per-context buffer, so any context the KV cache holds works.
#pragma once

#include <cuda_runtime_api.h>

#include "model/ops.h"

namespace nibble::cuda {

// Whether attention_prefill handles these heads (else the plain kernel runs).
bool attention_prefill_supported(const AttentionParams& params);

// The KV of this step must already be in the cache. q is the first Hq·D columns of qkv (T, width);
// out (T, Hq·D) BF16. Each sequence's new tokens have increasing positions, its last one the highest.
void attention_prefill(const Tensor& qkv, const KvCacheLayer& cache, KvCacheDType cache_dtype,
                       const ForwardBatch& batch, const AttentionParams& params, Tensor& out, cudaStream_t stream);

}  // namespace nibble::cuda
