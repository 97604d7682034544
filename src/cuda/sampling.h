// Sampling on the GPU: each row's argmax (temperature 0) or Gumbel-max draw (core/counter_rng.h), the
// CUDA twin of Ops::sample in src/model/ops.cc.
#pragma once

#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace nibble::cuda {

// out (R) I32 for logits (R, V) F32, temperatures (R) F32 and keys (R) I64, all on the device: the
// lowest index of each row's largest logit / temperature + Gumbel draw (of its logit where the
// temperature is 0), in double. One block per row.
void sample_rows(const Tensor& logits, const Tensor& temperatures, const Tensor& keys, Tensor& out,
                 cudaStream_t stream);

}  // namespace nibble::cuda
