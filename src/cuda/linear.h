// Dense linear layers on the GPU: y (T, N) = x (T, K) · Wᵀ for BF16 weights (cuBLAS, fp32 accumulate) and
// FP8 weights (x quantized to FP8 per token or with the static input scale, fp32 accumulate, scaled by
// act_scale[t] · scale[n]: the same arithmetic as the CPU twin, cpu/gemm.cc). The plain FP8 kernel is
// the correctness baseline; cuBLASLt or a wgmma kernel replaces it for speed.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "model/weights.h"

namespace nibble::cuda {

struct LinearWorkspace {
  Tensor x_fp8;    // F8_E4M3 (T, K)
  Tensor x_scale;  // F32 (T)
  Tensor x_sums;   // F32 (T, K / 64), unused here but written by the quantizer
};

// out: BF16 or F32 (T, N).
void linear(const Tensor& x, const Linear& w, Tensor& out, cublasHandle_t handle, LinearWorkspace& ws,
            cudaStream_t stream);

}  // namespace nibble::cuda
