// FP8 e4m3fn quantize/dequantize kernels and their launchers.
#include <cuda_fp8.h>

#include "cuda/cuda_check.h"
#include "cuda/fp8_convert.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

struct ConvertParams {
  const void* in;
  void* out;
  int64_t n;
  float scale;
};

__global__ void quantize_kernel(const __grid_constant__ ConvertParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (i >= p.n) return;
  const float x = static_cast<const float*>(p.in)[i] / p.scale;
  static_cast<__nv_fp8_storage_t*>(p.out)[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

__global__ void dequantize_kernel(const __grid_constant__ ConvertParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (i >= p.n) return;
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p.in)[i], __NV_E4M3);
  static_cast<float*>(p.out)[i] = __half2float(__half(h)) * p.scale;
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void quantize_fp8(const Tensor& in, float scale, Tensor& out) {
  expect(in, DType::kF32, {-1}, "quantize_fp8 input");
  expect(out, DType::kF8E4M3, {in.dim(0)}, "quantize_fp8 output");
  check(in.device() == Device::kCuda && out.device() == Device::kCuda, "quantize_fp8: tensors must be on cuda");
  if (in.numel() == 0) return;
  launch_kernel(quantize_kernel, blocks_for(in.numel()), kThreads, 0, nullptr,
                ConvertParams{in.raw(), out.raw(), in.numel(), scale});
  cuda_check(cudaGetLastError());
}

void dequantize_fp8(const Tensor& in, float scale, Tensor& out) {
  expect(in, DType::kF8E4M3, {-1}, "dequantize_fp8 input");
  expect(out, DType::kF32, {in.dim(0)}, "dequantize_fp8 output");
  check(in.device() == Device::kCuda && out.device() == Device::kCuda, "dequantize_fp8: tensors must be on cuda");
  if (in.numel() == 0) return;
  launch_kernel(dequantize_kernel, blocks_for(in.numel()), kThreads, 0, nullptr,
                ConvertParams{in.raw(), out.raw(), in.numel(), scale});
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
