// BF16 linears through cuBLAS; FP8 linears through per-token quantization and a warp-per-output kernel.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/linear.h"
#include "cuda/moe_quantize.h"

namespace nibble::cuda {
namespace {

void cublas_check(cublasStatus_t status) {
  check(status == CUBLAS_STATUS_SUCCESS, "cuBLAS error ", static_cast<int>(status));
}

constexpr int kWarps = 8;

struct Fp8LinearArgs {
  const uint8_t* x;       // (T, K)
  const float* x_scale;   // (T)
  const uint8_t* w;       // (N, K)
  const float* w_scale;   // (N)
  void* out;              // (T, N)
  bool out_f32;
  int64_t n, k;
};

__device__ inline float fp8_value(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// Grid (T, N / 8): each warp one output, lanes over K 16 bytes at a time.
__global__ void fp8_linear_kernel(const __grid_constant__ Fp8LinearArgs p) {
  const int64_t t = blockIdx.x, n = static_cast<int64_t>(blockIdx.y) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= p.n) return;
  const auto* x = reinterpret_cast<const uint4*>(p.x + t * p.k);
  const auto* w = reinterpret_cast<const uint4*>(p.w + n * p.k);
  float acc = 0.0f;
  for (int64_t i = lane; i < p.k / 16; i += 32) {
    const uint4 xv = x[i], wv = w[i];
    const auto* xb = reinterpret_cast<const uint8_t*>(&xv);
    const auto* wb = reinterpret_cast<const uint8_t*>(&wv);
#pragma unroll
    for (int j = 0; j < 16; ++j) acc += fp8_value(xb[j]) * fp8_value(wb[j]);
  }
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (lane != 0) return;
  const float y = acc * p.x_scale[t] * p.w_scale[n];
  if (p.out_f32)
    static_cast<float*>(p.out)[t * p.n + n] = y;
  else
    static_cast<__nv_bfloat16*>(p.out)[t * p.n + n] = __float2bfloat16_rn(y);
}

}  // namespace

void linear(const Tensor& x, const Linear& w, Tensor& out, cublasHandle_t handle, LinearWorkspace& ws,
            cudaStream_t stream) {
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
  check(K % 64 == 0, "CUDA FP8 linear: input size ", K, " is not a multiple of 64");
  if (ws.x_fp8.numel() < T * K) {
    ws.x_fp8 = empty(DType::kF8E4M3, {T * K});
    ws.x_scale = empty(DType::kF32, {T});
    ws.x_sums = empty(DType::kF32, {T * (K / 64)});
  }
  quantize_rows_fp8({.x = x.raw(), .codes = ws.x_fp8.data<uint8_t>(), .scale = ws.x_scale.data<float>(),
                     .sums = ws.x_sums.data<float>(), .rows = T, .cols = K, .static_scale = w.input_scale},
                    stream);
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((N + kWarps - 1) / kWarps));
  fp8_linear_kernel<<<grid, kWarps * 32, 0, stream>>>({.x = ws.x_fp8.data<uint8_t>(), .x_scale = ws.x_scale.data<float>(),
                                                       .w = w.weight.data<uint8_t>(), .w_scale = w.scale.data<float>(),
                                                       .out = out.raw(), .out_f32 = out.dtype() == DType::kF32,
                                                       .n = N, .k = K});
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
