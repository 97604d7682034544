// Per-row FP8 quantization kernels: one block per row, the row staged in shared memory.
#include <cuda_bf16.h>

#include "cuda/cuda_check.h"
#include "cuda/fp8_rows.cuh"
#include "cuda/moe_quantize.h"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxCols = 32768;

__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const __grid_constant__ QuantizeRowsArgs p) {
  extern __shared__ float values[];
  __shared__ float reduce[32];
  const int64_t r = blockIdx.x;
  const auto* x = static_cast<const __nv_bfloat16*>(p.x) + r * p.cols;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) values[i] = __bfloat162float(x[i]);
  __syncthreads();
  quantize_row_fp8(values, p.cols, p.codes + r * p.cols, p.scale + r, p.sums + r * (p.cols / kRowBlock), reduce);
}

__device__ inline float activate(Activation act, float x) {
  if (act == Activation::kSilu) return x / (1.0f + expf(-x));
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

__global__ void __launch_bounds__(kThreads) activation_kernel(const __grid_constant__ ActivationArgs p) {
  extern __shared__ float values[];
  __shared__ float reduce[32];
  const int64_t r = blockIdx.x, I = p.intermediate;
  for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
    float gate = 0.0f, up = 0.0f;
    for (int64_t s = 0; s < p.splits; ++s) {
      const float* row = p.gate_up + (s * p.max_rows + r) * 2 * I;
      gate += row[i];
      up += row[I + i];
    }
    values[i] = activate(p.activation, gate) * up;
  }
  __syncthreads();
  quantize_row_fp8(values, I, p.codes + r * I, p.scale + r, p.sums + r * (I / kRowBlock), reduce);
}

template <typename Kernel>
void set_smem(Kernel kernel) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kMaxCols * sizeof(float))));
}

}  // namespace

void quantize_rows_fp8(const QuantizeRowsArgs& p, cudaStream_t stream) {
  check(p.cols % kRowBlock == 0 && p.cols <= kMaxCols, "quantize_rows_fp8: ", p.cols, " columns");
  static const bool configured = (set_smem(quantize_rows_kernel), true);
  (void)configured;
  if (p.rows == 0) return;
  quantize_rows_kernel<<<static_cast<unsigned>(p.rows), kThreads, p.cols * sizeof(float), stream>>>(p);
  cuda_check(cudaGetLastError());
}

void activation_quantize_fp8(const ActivationArgs& p, cudaStream_t stream) {
  check(p.intermediate % kRowBlock == 0 && p.intermediate <= kMaxCols, "activation_quantize_fp8: ",
        p.intermediate, " columns");
  static const bool configured = (set_smem(activation_kernel), true);
  (void)configured;
  if (p.rows == 0) return;
  activation_kernel<<<static_cast<unsigned>(p.rows), kThreads, p.intermediate * sizeof(float), stream>>>(p);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
