// BF16 linears through cuBLAS; FP8 linears of a few tokens in one kernel (fp8_gemv.h), else through
// per-token quantization, cuBLASLt and a scaling pass (or cuBLASLt's own outer-vector scaling,
// NIBBLE_LT_OUTER_SCALES=1).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "cuda/cuda_check.h"
#include "cuda/env_setting.h"
#include "cuda/device.h"
#include "cuda/fp8_gemv.h"
#include "cuda/fp8_linear_mma.h"
#include "cuda/launch.h"
#include "cuda/linear.h"
#include "cuda/moe_quantize.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr std::size_t kLtScratchBytes = std::size_t{32} << 20;

struct ScaleArgs {
  const float* product;  // (T, N)
  const float* x_scale;  // (T)
  const float* w_scale;  // (N)
  void* out;             // (T, N) BF16 or F32
  int64_t tokens, n;     // N % 4 == 0; product, w_scale and out 16-byte aligned
};

constexpr int kScaleThreads = 128;

__device__ inline void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

__device__ inline void store4(__nv_bfloat16* p, const float (&v)[4]) {
  uint2 u;
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(&u);
  pairs[0] = __floats2bfloat162_rn(v[0], v[1]);
  pairs[1] = __floats2bfloat162_rn(v[2], v[3]);
  *reinterpret_cast<uint2*>(p) = u;
}

// out = product · x_scale[t] · w_scale[n] (in that order, as the CPU twin), rounded once for BF16.
// Grid (N / 4 / kScaleThreads rounded up, up to 65535 rows): a thread takes 4 columns (16-byte
// loads) of rows blockIdx.y, + gridDim.y, ..., with its 4 weight scales loaded once.
template <typename Out>
__global__ void __launch_bounds__(kScaleThreads) scale_product_kernel(const __grid_constant__ ScaleArgs p) {
  const int64_t c = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * 4;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (c >= p.n) return;
  const float4 ws = *reinterpret_cast<const float4*>(p.w_scale + c);
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const float xs = p.x_scale[t];
    const float4 v = *reinterpret_cast<const float4*>(p.product + t * p.n + c);
    const float y[4] = {v.x * xs * ws.x, v.y * xs * ws.y, v.z * xs * ws.z, v.w * xs * ws.w};
    store4(static_cast<Out*>(p.out) + t * p.n + c, y);
  }
}

// Whether FP8 linears ask cuBLASLt for outer-vector scaling (NIBBLE_LT_OUTER_SCALES=1) instead of
// scaling the product in a pass. Off by default: measured on an H200 (CUDA 13.0, bench/RESULTS.md,
// 2026-11-30), cuBLASLt's outer-vector kernels made Mixtral-8x7B W4A8 decode slower, batch 32 11.30
// ms a step against 10.82-10.99 and batch 1 4.49 against 4.01, though they save the 64 scaling passes.
bool outer_scales() {
  static const bool on = env_switch("NIBBLE_LT_OUTER_SCALES");
  return on;
}

// The FP8 GEMM of a linear, NIBBLE_FP8_LINEAR: "gemv" (fp8_gemv.h: quantization, products and
// scales in one kernel, up to kFp8GemvMaxTokens tokens), "mma" (fp8_linear_mma.h: exact products,
// fp32 sums), "cublaslt", or "auto" (the default: gemv up to kGemvAutoTokens tokens, else cuBLASLt).
// Measured on an H200 (bench/RESULTS.md, 2026-11-30, CudaOpsTwin.Fp8LinearTiming, graph-replayed µs a
// call, gemv / cuBLASLt path): Mixtral-8x7B qkv 1 token 10.05 / 10.20, 2 tokens 15.8 / 9.9; o 6.73 /
// 7.91, 9.83 / 7.90; Mixtral-8x7B W4A8 + FP8 KV decode at batch 1 3.86 ms a step with gemv against
// 4.14 without. The F32 linear against the CPU came to 5.9e-8 relative L2 with mma against 1.3e-4.
// The first mma kernel (K split over the grid, partial sums added by the scaling pass) made
// Mixtral-8x7B W4A8 decode at batch 32 slower, 11.34 ms a step against 10.78 with cuBLASLt; the
// present one (K split over a block's warps, scales applied in the kernel: one launch after the
// quantization where cuBLASLt takes two or three) is slower too (fifteenth session): Grok-1 tp 2
// batch 32 29.48 ms a step against 29.18, Mixtral-8x7B tp 2 6.58 against 6.42; graph-replayed,
// Grok-1 tp 2 rank qkv at 32 tokens 14.9 µs against 11.8 (at one token 12.6 against 11.3 and gemv's
// 8.9). It stays for its exact fp32 sums (the tp equivalence figures of test_cuda_tp.cc).
enum class Fp8Gemm { kAuto, kGemv, kMma, kCublasLt };
constexpr int64_t kGemvAutoTokens = 1;

Fp8Gemm fp8_gemm_setting() {
  static const Fp8Gemm setting = [] {
    const std::string name = env_choice("NIBBLE_FP8_LINEAR", {"auto", "gemv", "mma", "cublaslt"});
    return name == "gemv" ? Fp8Gemm::kGemv : name == "mma" ? Fp8Gemm::kMma : name == "cublaslt" ? Fp8Gemm::kCublasLt
                                                                                              : Fp8Gemm::kAuto;
  }();
  return setting;
}

Fp8Gemm fp8_gemm_for(int64_t tokens, int64_t n, int64_t k) {
  const Fp8Gemm setting = fp8_gemm_setting();
  if (setting == Fp8Gemm::kMma) return fp8_mma_supported(tokens, n, k) ? Fp8Gemm::kMma : Fp8Gemm::kCublasLt;
  const int64_t most = setting == Fp8Gemm::kGemv ? kFp8GemvMaxTokens : setting == Fp8Gemm::kAuto ? kGemvAutoTokens : 0;
  return tokens <= most && fp8_gemv_supported(tokens, k) ? Fp8Gemm::kGemv : Fp8Gemm::kCublasLt;
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
  grow(ws.lt_scratch, DType::kU8, static_cast<int64_t>(kLtScratchBytes), ws.retired);
  QuantizeRowsArgs quantize{.x = x.raw(), .codes = ws.x_fp8.data<uint8_t>(), .scale = ws.x_scale.data<float>(),
                            .sums = nullptr, .rows = T, .cols = K, .static_scale = w.input_scale};
  if (row_group != nullptr && w.input_scale <= 0.0f && !tp_local_amax()) {  // the row's amax over every rank
    grow(ws.x_amax, DType::kF32, T, ws.retired);
    QuantizeRowsArgs amax = quantize;
    amax.amax_out = ws.x_amax.data<float>();
    quantize_rows_fp8(amax, stream);
    Tensor rows_amax = ws.x_amax.slice(0, T);
    row_group->all_reduce_max(rows_amax);
    quantize.amax_in = ws.x_amax.data<float>();
  }
  const Fp8Gemm gemm = fp8_gemm_for(T, N, K);
  if (gemm == Fp8Gemm::kGemv) {
    fp8_gemv({.x = x.raw(), .w = w.weight.data<uint8_t>(), .w_scale = w.scale.data<float>(), .out = out.raw(),
              .out_f32 = out.dtype() == DType::kF32, .tokens = T, .n = N, .k = K, .static_scale = w.input_scale,
              .amax_in = quantize.amax_in},
             stream);
    return;
  }
  quantize_rows_fp8(quantize, stream);
  if (gemm == Fp8Gemm::kMma) {
    return fp8_linear_mma({.x = ws.x_fp8.data<uint8_t>(), .w = w.weight.data<uint8_t>(),
                           .x_scale = ws.x_scale.data<float>(), .w_scale = w.scale.data<float>(), .out = out.raw(),
                           .out_f32 = out.dtype() == DType::kF32, .tokens = T, .n = N, .k = K},
                          stream);
  }
  if (outer_scales()) {
    auto& scaled = ws.scaled_plans[{N, T, K, out.dtype()}];
    if (!scaled)
      scaled = std::make_unique<LtFp8Gemm>(ws.lt, N, T, K, kLtScratchBytes, out.dtype(),
                                           LtFp8Gemm::Scales::kOuterVectors, w.scale.data<float>(),
                                           ws.x_scale.data<float>());
    if (scaled->usable() && scaled->run_scaled(w.weight.raw(), ws.x_fp8.raw(), out.raw(), w.scale.data<float>(),
                                               ws.x_scale.data<float>(), ws.lt_scratch.raw(), stream))
      return;
  }
  grow(ws.product, DType::kF32, T * N, ws.retired);
  auto& plan = ws.plans[{N, T, K}];
  if (!plan) plan = std::make_unique<LtFp8Gemm>(ws.lt, N, T, K, kLtScratchBytes, DType::kF32);
  plan->run(w.weight.raw(), ws.x_fp8.raw(), ws.product.raw(), 1.0f, ws.lt_scratch.raw(), stream);
  const auto aligned16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  check(aligned16(out.raw()) && aligned16(w.scale.raw()),
        "CUDA FP8 linear: the output or the weight scales are not 16-byte aligned");
  const ScaleArgs scale{.product = ws.product.data<float>(), .x_scale = ws.x_scale.data<float>(),
                        .w_scale = w.scale.data<float>(), .out = out.raw(), .tokens = T, .n = N};
  const dim3 grid(static_cast<unsigned>((N / 4 + kScaleThreads - 1) / kScaleThreads),
                  static_cast<unsigned>(std::min<int64_t>(T, 65535)));
  if (out.dtype() == DType::kF32)
    launch_kernel(scale_product_kernel<float>, grid, kScaleThreads, 0, stream, scale);
  else
    launch_kernel(scale_product_kernel<__nv_bfloat16>, grid, kScaleThreads, 0, stream, scale);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
