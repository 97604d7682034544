// BF16 linears through cuBLAS; FP8 linears through per-token quantization, cuBLASLt and a scaling pass.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/linear.h"
#include "cuda/moe_quantize.h"

namespace nibble::cuda {
namespace {

constexpr std::size_t kLtScratchBytes = std::size_t{32} << 20;

struct ScaleArgs {
  const float* product;  // (T, N)
  const float* x_scale;  // (T)
  const float* w_scale;  // (N)
  void* out;             // (T, N) BF16 or F32
  bool out_f32;
  int64_t tokens, n;
};

// out = product · x_scale[t] · w_scale[n], four elements a thread.
__global__ void scale_product_kernel(const __grid_constant__ ScaleArgs p) {
  const int64_t total = p.tokens * p.n;
  for (int64_t i = 4 * (blockIdx.x * int64_t{blockDim.x} + threadIdx.x); i < total;
       i += 4 * int64_t{gridDim.x} * blockDim.x) {
    for (int64_t j = i; j < i + 4 && j < total; ++j) {
      const float y = p.product[j] * p.x_scale[j / p.n] * p.w_scale[j % p.n];
      if (p.out_f32)
        static_cast<float*>(p.out)[j] = y;
      else
        static_cast<__nv_bfloat16*>(p.out)[j] = __float2bfloat16_rn(y);
    }
  }
}

// Grows `t` to at least `numel` elements, keeping the old buffer alive.
void grow(Tensor& t, DType dtype, int64_t numel, std::vector<Tensor>& retired) {
  if (t.defined() && t.numel() >= numel) return;
  if (t.defined()) retired.push_back(t);
  t = empty(dtype, {numel});
}

}  // namespace

void linear(const Tensor& x, const Linear& w, Tensor& out, cublasHandle_t handle, LinearWorkspace& ws,
            cudaStream_t stream, Communicator* row_group) {
  const int64_t T = x.dim(0), N = w.out_features, K = w.in_features;
  expect(x, DType::kBF16, {-1, K}, "linear input");
  check(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32, "linear output must be BF16 or F32");
  expect(out, out.dtype(), {T, N}, "linear output");
  if (T == 0) return;
  if (w.format == WeightFormat::kBf16) {
    const float alpha = 1.0f, beta = 0.0f;
    cublas_check(cublasSetStream(handle, stream));
    // Column-major view: out^T (N, T) = W (N, K) · x^T (K, T).
    cublas_check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(T),
                              static_cast<int>(K), &alpha, w.weight.raw(), CUDA_R_16BF, static_cast<int>(K), x.raw(),
                              CUDA_R_16BF, static_cast<int>(K), &beta, out.raw(),
                              out.dtype() == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(N),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  check(w.format == WeightFormat::kFp8, "CUDA linear: ", weight_format_name(w.format), " weights are not supported");
  check(K % 16 == 0 && N % 16 == 0, "CUDA FP8 linear: sizes ", N, "x", K, " are not multiples of 16");
  check(ws.lt != nullptr, "CUDA FP8 linear: no cuBLASLt handle");
  grow(ws.x_fp8, DType::kF8E4M3, T * K, ws.retired);
  grow(ws.x_scale, DType::kF32, T, ws.retired);
  grow(ws.product, DType::kF32, T * N, ws.retired);
  grow(ws.lt_scratch, DType::kU8, static_cast<int64_t>(kLtScratchBytes), ws.retired);
  QuantizeRowsArgs quantize{.x = x.raw(), .codes = ws.x_fp8.data<uint8_t>(), .scale = ws.x_scale.data<float>(),
                            .sums = nullptr, .rows = T, .cols = K, .static_scale = w.input_scale};
  if (row_group != nullptr && w.input_scale <= 0.0f) {  // each row's amax over every rank's slice first
    grow(ws.x_amax, DType::kF32, T, ws.retired);
    QuantizeRowsArgs amax = quantize;
    amax.amax_out = ws.x_amax.data<float>();
    quantize_rows_fp8(amax, stream);
    Tensor rows_amax = ws.x_amax.slice(0, T);
    row_group->all_reduce_max(rows_amax);
    quantize.amax_in = ws.x_amax.data<float>();
  }
  quantize_rows_fp8(quantize, stream);
  auto& plan = ws.plans[{N, T, K}];
  if (!plan) plan = std::make_unique<LtFp8Gemm>(ws.lt, N, T, K, kLtScratchBytes, DType::kF32);
  plan->run(w.weight.raw(), ws.x_fp8.raw(), ws.product.raw(), 1.0f, ws.lt_scratch.raw(), stream);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((T * N / 4 + 255) / 256 + 1, 4096));
  scale_product_kernel<<<blocks, 256, 0, stream>>>({.product = ws.product.data<float>(),
                                                   .x_scale = ws.x_scale.data<float>(),
                                                   .w_scale = w.scale.data<float>(), .out = out.raw(),
                                                   .out_f32 = out.dtype() == DType::kF32, .tokens = T, .n = N});
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
