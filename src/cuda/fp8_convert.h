// Elementwise FP8 e4m3fn conversions on the GPU with the hardware's converter (round to nearest even,
// saturating to ±448): the device twin of core/fp8.h, and the rounding every CUDA kernel relies on.
#pragma once

#include "core/tensor.h"

namespace nibble::cuda {

// out (n) F8_E4M3 = fp8(in (n) F32 / scale).
void quantize_fp8(const Tensor& in, float scale, Tensor& out);
// out (n) F32 = in (n) F8_E4M3 × scale.
void dequantize_fp8(const Tensor& in, float scale, Tensor& out);

}  // namespace nibble::cuda
