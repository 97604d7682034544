// The small elementwise and row ops of the forward pass on the GPU (BF16 activations): embedding
// lookup, RMSNorm, residual add, neox rotary embedding, KV-cache append and a plain paged attention.
// Each has a CPU twin in src/cpu with the same contract (ops.h); tests compare the two.
#pragma once

#include <cuda_runtime_api.h>

#include "model/ops.h"

namespace nibble::cuda {

// out (R, H) = x[rows] for rows (R) I32.
void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out, cudaStream_t stream);
void embedding(const Tensor& ids, const Tensor& table, Tensor& out, cudaStream_t stream);
// out BF16 (T, H) = rms_norm(x (T, H)); x BF16, or F32 (a tensor-parallel sum, rounded to BF16 as read).
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out, cudaStream_t stream);
// x BF16 += y, y BF16 or F32 (rounded to BF16 as read, then summed in fp32 and rounded once).
void residual_add(Tensor& x, const Tensor& y, cudaStream_t stream);
// x *= factor, for BF16 or F32 x.
void scale(Tensor& x, float factor, cudaStream_t stream);
// inv_freq: F32 (head_dim / 2) on the device.
void rope(Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const AttentionParams& params,
          cudaStream_t stream);
void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
               const AttentionParams& params, Tensor& out, cudaStream_t stream);

}  // namespace nibble::cuda
