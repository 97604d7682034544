// BF16-expert MoE layer (moe_bf16.h).
#include "cuda/moe_bf16.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "cuda/activation.cuh"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/lt_fp8_gemm.h"
#include "cuda/moe_route.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 256;

struct ActArgs {
  const float* gate_up;  // (T, 2I)
  __nv_bfloat16* act;    // (T, I)
  int64_t tokens, inter;
  Activation activation;
};

__global__ void act_kernel(const __grid_constant__ ActArgs p) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t total = p.tokens * p.inter;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.inter, c = i % p.inter;
    const float* row = p.gate_up + t * 2 * p.inter;
    p.act[i] = __float2bfloat16_rn(activate(p.activation, row[c]) * row[p.inter + c]);
  }
}

struct AccumulateArgs {
  const float* down;          // (T, H)
  const int32_t* topk_ids;    // (T, K)
  const float* topk_weights;  // (T, K)
  float* sum;                 // (T, H)
  int64_t tokens, hidden, top_k;
  int expert;
  bool first;  // sum = instead of sum +=
};

__global__ void accumulate_kernel(const __grid_constant__ AccumulateArgs p) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t total = p.tokens * p.hidden;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.hidden;
    float weight = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k)
      if (p.topk_ids[t * p.top_k + k] == p.expert) weight = p.topk_weights[t * p.top_k + k];
    const float v = weight != 0.0f ? weight * p.down[i] : 0.0f;
    p.sum[i] = p.first ? v : p.sum[i] + v;
  }
}

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 8192)); }

void grow(Tensor& t, DType dtype, Shape shape, std::vector<Tensor>& retired) {
  const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  if (t.defined() && t.numel() >= n) return;
  if (t.defined()) retired.push_back(t);
  t = empty(dtype, std::move(shape));
}

// out (T, N) F32 = x (T, K) BF16 · W (N, K)ᵀ BF16.
void gemm_bf16(cublasHandle_t handle, const void* x, const void* w, float* out, int64_t T, int64_t N, int64_t K) {
  const float alpha = 1.0f, beta = 0.0f;
  cublas_check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(T),
                            static_cast<int>(K), &alpha, w, CUDA_R_16BF, static_cast<int>(K), x, CUDA_R_16BF,
                            static_cast<int>(K), &beta, out, CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void moe_bf16(const Tensor& x, const MoeWeights& w, const MoeParams& params, MoeBf16Workspace& ws, Tensor& out,
              cublasHandle_t handle, cudaStream_t stream) {
  const Experts& ex = w.experts;
  const int64_t T = x.dim(0), H = ex.hidden_size, I = ex.intermediate_size, E = ex.num_experts, K = params.top_k;
  check(ex.format == WeightFormat::kBf16, "moe_bf16: experts are ", weight_format_name(ex.format));
  expect(x, DType::kBF16, {-1, H}, "moe_bf16 input");
  check(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32, "moe_bf16 output ", out.describe(),
        " is not BF16 or F32");
  expect(out, out.dtype(), {T, H}, "moe_bf16 output");
  const bool f32_out = out.dtype() == DType::kF32;
  if (T == 0) return;
  grow(ws.router_logits, DType::kF32, {T, E}, ws.retired);
  grow(ws.topk_ids, DType::kI32, {T, K}, ws.retired);
  grow(ws.topk_weights, DType::kF32, {T, K}, ws.retired);
  grow(ws.gate_up, DType::kF32, {T, 2 * I}, ws.retired);
  grow(ws.act, DType::kBF16, {T, I}, ws.retired);
  grow(ws.down, DType::kF32, {T, H}, ws.retired);
  if (!f32_out) grow(ws.sum, DType::kF32, {T, H}, ws.retired);
  float* sum = f32_out ? out.data<float>() : ws.sum.data<float>();
  ws.max_tokens = std::max(ws.max_tokens, T);

  route_topk({.x = x.raw(), .router = w.router.raw(), .logits = ws.router_logits.data<float>(),
              .topk_ids = ws.topk_ids.data<int32_t>(), .topk_weights = ws.topk_weights.data<float>(), .tokens = T,
              .hidden = H, .experts = E, .top_k = K, .norm = params.router_norm, .softcap = params.router_softcap},
             stream);
  cublas_check(cublasSetStream(handle, stream));
  const auto* gate_up = static_cast<const __nv_bfloat16*>(ex.gate_up.raw());
  const auto* down = static_cast<const __nv_bfloat16*>(ex.down.raw());
  for (int64_t e = 0; e < E; ++e) {
    gemm_bf16(handle, x.raw(), gate_up + e * 2 * I * H, ws.gate_up.data<float>(), T, 2 * I, H);
    launch_kernel(act_kernel, blocks_for(T * I), kThreads, 0, stream,
                  ActArgs{.gate_up = ws.gate_up.data<float>(), .act = static_cast<__nv_bfloat16*>(ws.act.raw()),
                          .tokens = T, .inter = I, .activation = params.activation});
    cuda_check(cudaGetLastError());
    gemm_bf16(handle, ws.act.raw(), down + e * H * I, ws.down.data<float>(), T, H, I);
    launch_kernel(accumulate_kernel, blocks_for(T * H), kThreads, 0, stream,
                  AccumulateArgs{.down = ws.down.data<float>(), .topk_ids = ws.topk_ids.data<int32_t>(),
                                 .topk_weights = ws.topk_weights.data<float>(), .sum = sum, .tokens = T, .hidden = H,
                                 .top_k = K, .expert = static_cast<int>(e), .first = e == 0});
    cuda_check(cudaGetLastError());
  }
  if (f32_out) return;
  launch_kernel(to_bf16_kernel, blocks_for(T * H), kThreads, 0, stream, sum, static_cast<__nv_bfloat16*>(out.raw()),
                T * H);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
