// CUDA device memory as Tensors: allocation, host <-> device copies, and whether a GPU is present.
// Host code only; kernels live one op per .cu file beside this.
#pragma once

#include "core/tensor.h"

namespace nibble::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count();

Tensor empty(DType dtype, Shape shape);  // uninitialized device memory
Tensor upload(const Tensor& host);
Tensor download(const Tensor& device_tensor);

}  // namespace nibble::cuda
