// Paged decode attention (one query token per sequence) over a BF16 or FP8 KV cache: split-KV
// ("flash-decoding"). Each block takes one sequence, one KV head and one slice of its context, scores
// the whole GQA group of query heads against each key it loads once on the tensor cores (f16 MMAs
// over an FP8 cache, bf16 over a BF16 one, f32 accumulation), and keeps an online softmax per warp;
// a second kernel merges the slices. The launch depends only on the batch size and the block-table
// width, never on the context lengths, so a CUDA graph replays it at any context.
#pragma once

#include <cuda_runtime_api.h>

#include "model/ops.h"

namespace nibble::cuda {

// Whether attention_decode handles this batch and these heads (else the plain kernel runs).
bool attention_decode_supported(const ForwardBatch& batch, const AttentionParams& params);

// Whether rope_attention's decode steps should leave RoPE and the KV append to attention_decode (one
// launch fewer): by default when its grid runs in one wave of the device's block slots, where the
// extra work at each block's start (the step's angles, the new key's append) hides; measured on an
// H200 (bench/RESULTS.md): batch 1 gains, batch 32 (2.6 waves) loses. NIBBLE_DECODE_APPEND=decode or
// kernel forces either.
bool attention_decode_appends(const ForwardBatch& batch, const AttentionParams& params, KvCacheDType cache_dtype);

// q is the first Hq·D columns of qkv (S, width). Without inv_freq the KV of this step must already be
// in the cache. With inv_freq (F32, D / 2: rope_attention's decode steps) the kernel does the step's
// RoPE and KV append itself: q is rotated as it loads (qkv keeps its unrotated values), and each
// sequence's new key, rotated, and its value go into the cache at batch.slot_mapping before they are
// read, the same bits as RoPE then the append kernel.
void attention_decode(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
                      const AttentionParams& params, Tensor& out, cudaStream_t stream,
                      const Tensor* inv_freq = nullptr);

}  // namespace nibble::cuda
