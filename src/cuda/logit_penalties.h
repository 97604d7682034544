// Sampling penalties on the GPU (the CPU twin is Ops::penalize in src/model/ops.cc): each row's seen
// tokens take penalized_logit (core/logit_penalties.h), in place.
#pragma once

#include <cuda_runtime_api.h>

#include "model/ops.h"

namespace nibble::cuda {

// logits (R, V) F32 in place; settings as Ops::penalize states (device tensors). One block per row.
void penalize_rows(Tensor& logits, const PenaltySettings& settings, cudaStream_t stream);

}  // namespace nibble::cuda
