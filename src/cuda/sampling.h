// Sampling on the GPU: each row's argmax (temperature 0) or Gumbel-max draw (core/counter_rng.h), among
// the tokens top-k and top-p keep where asked (core/sampling_filter.h): the CUDA twin of Ops::sample in
// src/model/ops.cc, token for token.
#pragma once

#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace nibble::cuda {

// out (R) I32 for logits (R, V) F32, temperatures (R) F32 and keys (R) I64, all on the device: the
// lowest index of each row's largest logit / temperature + Gumbel draw (of its logit where the
// temperature is 0), in double. One block per row.
void sample_rows(const Tensor& logits, const Tensor& temperatures, const Tensor& keys, Tensor& out,
                 cudaStream_t stream);

// The same draws among the tokens that each row's top_k (R) I32 (0: no limit) and then top_p (R) F32 (1:
// no limit) keep, either null for no limit in any row (sampling_filtered.cu). Rows without a limit, and
// those of temperature 0, draw as in sample_rows. One block per row.
void sample_filtered_rows(const Tensor& logits, const Tensor& temperatures, const Tensor& keys, const Tensor* top_k,
                          const Tensor* top_p, Tensor& out, cudaStream_t stream);

}  // namespace nibble::cuda
