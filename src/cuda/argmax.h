// Greedy sampling on the GPU: each row's argmax (the CPU twin is Ops::argmax in src/model/ops.cc).
#pragma once

#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace nibble::cuda {

// out (R) I32 = the index of the largest value of each row of x (R, V) F32; ties go to the lowest
// index. One block per row.
void argmax_rows(const Tensor& x, Tensor& out, cudaStream_t stream);

}  // namespace nibble::cuda
