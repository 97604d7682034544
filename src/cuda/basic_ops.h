// The small elementwise and row ops of the forward pass on the GPU (the F32 residual stream, BF16
// activations; dtypes as ops.h states them): embedding lookup, RMSNorm, residual add, neox rotary
// embedding, KV-cache append and a plain paged attention. Each has a CPU twin in src/cpu with the
// same contract (ops.h); tests compare the two. Row sizes must be multiples of 8 (16-byte vectors).
#pragma once

#include <cuda_runtime_api.h>

#include "model/ops.h"

namespace nibble::cuda {

// out (R, H) = x[rows] for rows (R) I32.
void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out, cudaStream_t stream);
// out F32 (T, H) = table[ids] for ids (T) I32, table (V, H) BF16.
void embedding(const Tensor& ids, const Tensor& table, Tensor& out, cudaStream_t stream);
// out BF16 (T, H) = x / rms(x) × weight for x F32 (T, H), weight BF16 (H); H <= 32768.
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out, cudaStream_t stream);
// x F32 (T, H) += y (F32 or BF16, (T, H)), then out = rms_norm(x) as above, in one kernel: the same
// values as residual_add then rms_norm. out may be y.
void add_rms_norm(Tensor& x, const Tensor& y, const Tensor& weight, float eps, Tensor& out, cudaStream_t stream);
// x F32 += y, y F32 or BF16 (same element count), in fp32 with nothing rounded.
void residual_add(Tensor& x, const Tensor& y, cudaStream_t stream);
// x *= factor, for F32 x.
void scale(Tensor& x, float factor, cudaStream_t stream);
// Neox RoPE in place on qkv BF16 (T, (Hq + 2·Hkv)·D), D a multiple of 16; inv_freq F32 (D / 2) on
// the device.
void rope(Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const AttentionParams& params,
          cudaStream_t stream);
void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
               const AttentionParams& params, Tensor& out, cudaStream_t stream);
// rope(qkv, batch.positions, inv_freq, params), then attention: the rotation and the KV append in one
// kernel.
void rope_attention(Tensor& qkv, const Tensor& inv_freq, KvCacheLayer& cache, KvCacheDType cache_dtype,
                    const ForwardBatch& batch, const AttentionParams& params, Tensor& out, cudaStream_t stream);

}  // namespace nibble::cuda
