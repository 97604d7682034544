// Dense linear layers on the GPU: y (T, N) = x (T, K) · Wᵀ for BF16 weights (cuBLAS, fp32 accumulate) and
// FP8 weights (x quantized to FP8 per token or with the static input scale, the FP8 product by cuBLASLt
// with fp32 accumulation, then scaled by act_scale[t] · scale[n]: the same arithmetic as the CPU twin,
// cpu/gemm.cc).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "cuda/lt_fp8_gemm.h"
#include "model/communicator.h"
#include "model/weights.h"

namespace nibble::cuda {

// Scratch that only grows. Superseded buffers are kept (`retired`): a recorded CUDA graph may still
// read them.
struct LinearWorkspace {
  cublasLtHandle_t lt = nullptr;  // owned by the caller
  Tensor lt_scratch;  // U8: cuBLASLt's workspace
  Tensor x_fp8;       // F8_E4M3 (T, K)
  Tensor x_scale;     // F32 (T)
  Tensor x_amax;      // F32 (T): rows' amax over ranks (a row-parallel linear under tensor parallelism)
  Tensor product;     // F32 (T, N): the unscaled FP8 product (where the GEMM cannot scale it)
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<LtFp8Gemm>> plans;  // (N, T, K)
  // (N, T, K, out dtype): the GEMM with outer-vector scales, writing out itself
  std::map<std::tuple<int64_t, int64_t, int64_t, DType>, std::unique_ptr<LtFp8Gemm>> scaled_plans;
  std::vector<Tensor> retired;
};

// out: BF16 or F32 (T, N). row_group: see Ops::linear (x is this rank's slice of each row).
void linear(const Tensor& x, const Linear& w, Tensor& out, cublasHandle_t handle, LinearWorkspace& ws,
            cudaStream_t stream, Communicator* row_group = nullptr);

}  // namespace nibble::cuda
