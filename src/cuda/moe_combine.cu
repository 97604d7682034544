// Weighted combine: out[t] (BF16 or F32) = Σ_k weight[t, k] · Σ_split down[split][row_pos[t, k]];
// and the prefill path's windowed form with the activation and weight scales applied here. Each
// kernel is instantiated for a BF16 output (one GPU) and an F32 one (a tensor-parallel partial sum).
#include <cuda_bf16.h>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/moe_combine.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 128;

// Four consecutive outputs from fp32 sums: rounded to BF16, or stored as they are.
__device__ inline void store4(__nv_bfloat16* out, float4 v) {
  auto* out2 = reinterpret_cast<__nv_bfloat162*>(out);
  out2[0] = __floats2bfloat162_rn(v.x, v.y);
  out2[1] = __floats2bfloat162_rn(v.z, v.w);
}
__device__ inline void store4(float* out, float4 v) { *reinterpret_cast<float4*>(out) = v; }

// One warp a block, so that a single token (decode: a few MB of split partials) still spreads over
// H / 128 SMs; the split loop unrolled to keep several 16-byte loads in flight.
// Measured and not kept (bench/RESULTS.md, sixteenth session): this combine fused with the residual
// add and the next RMSNorm as one block a token (rms_norm_kernel's layout, the same bits as the steps),
// Mixtral-8x7B W4A8 decode 3.67 against 3.59 ms a step at batch 1 and 9.69 against 9.64 at batch 32:
// a token's split partials read by one SM cost more than the launch it saves.
constexpr int kCombineThreads = 32;

// Grid (T, H / 128): each thread sums 4 consecutive columns over the top-k rows and the K splits
// (in that order). Out: __nv_bfloat16 or float.
template <typename Out>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const __grid_constant__ CombineArgs p, bool trigger_first) {
  const int64_t t = blockIdx.x;
  const int64_t h4 = static_cast<int64_t>(blockIdx.y) * kCombineThreads + threadIdx.x;  // column / 4
  ptx::dependency_wait(trigger_first);
  if (h4 >= p.hidden / 4) return;
  float4 sum = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t k = 0; k < p.top_k; ++k) {
    const int64_t row = p.row_pos[t * p.top_k + k];
    const float w = p.topk_weights[t * p.top_k + k];
#pragma unroll 4
    for (int64_t s = 0; s < p.splits; ++s) {
      const float4 y = reinterpret_cast<const float4*>(p.down + (s * p.max_rows + row) * p.hidden)[h4];
      sum = {__fmaf_rn(w, y.x, sum.x), __fmaf_rn(w, y.y, sum.y), __fmaf_rn(w, y.z, sum.z), __fmaf_rn(w, y.w, sum.w)};
    }
  }
  store4(static_cast<Out*>(p.out) + t * p.hidden + 4 * h4, sum);
}

// Elements i .. i + 3 of the window's product (F32 or BF16).
__device__ inline float4 load4(const CombineRowsArgs& p, int64_t i) {
  if (p.down != nullptr) return *reinterpret_cast<const float4*>(p.down + i);
  const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p.down_bf16) + i);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
  return {lo.x, lo.y, hi.x, hi.y};
}

// Grid (T, H / 512) like combine_kernel; only the pairs whose padded row lies in this window count.
template <typename Out>
__global__ void combine_rows_kernel(const __grid_constant__ CombineRowsArgs p) {
  const int64_t t = blockIdx.x;
  const int64_t h4 = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;  // column / 4
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (h4 >= p.hidden / 4) return;
  float4 sum = {0.0f, 0.0f, 0.0f, 0.0f};
  bool hit = false;
  for (int64_t k = 0; k < p.top_k; ++k) {
    const int64_t row = p.pair_row[t * p.top_k + k];
    if (row < p.row_begin || row >= p.row_end) continue;
    hit = true;
    const int64_t local = row - p.row_begin, e = p.topk_ids[t * p.top_k + k];
    const float w = p.topk_weights[t * p.top_k + k] * p.row_scale[local];
    const float4 y = load4(p, local * p.hidden + 4 * h4);
    const float4 c = reinterpret_cast<const float4*>(p.channel_scale + e * p.hidden)[h4];
    sum = {sum.x + w * (c.x * y.x), sum.y + w * (c.y * y.y), sum.z + w * (c.z * y.z), sum.w + w * (c.w * y.w)};
  }
  if (p.pass != CombinePass::kOnly) {
    auto* acc = reinterpret_cast<float4*>(p.acc + t * p.hidden) + h4;
    if (p.pass == CombinePass::kMiddle || p.pass == CombinePass::kLast) {
      if (!hit && p.pass == CombinePass::kMiddle) return;
      const float4 a = *acc;
      sum = {a.x + sum.x, a.y + sum.y, a.z + sum.z, a.w + sum.w};
    }
    if (p.pass != CombinePass::kLast) {
      *acc = sum;
      return;
    }
  }
  store4(static_cast<Out*>(p.out) + t * p.hidden + 4 * h4, sum);
}

}  // namespace

void moe_combine_rows(const CombineRowsArgs& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  check(p.hidden % 4 == 0, "moe_combine_rows: hidden size ", p.hidden, " is not a multiple of 4");
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>((p.hidden / 4 + kThreads - 1) / kThreads));
  switch (p.out_dtype) {
    case DType::kBF16:
      launch_kernel(combine_rows_kernel<__nv_bfloat16>, grid, kThreads, 0, stream, p);
      break;
    case DType::kF32:
      launch_kernel(combine_rows_kernel<float>, grid, kThreads, 0, stream, p);
      break;
    default:
      fail("moe_combine_rows: the output must be BF16 or F32, not ", dtype_name(p.out_dtype));
  }
  cuda_check(cudaGetLastError());
}

void moe_combine(const CombineArgs& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  check(p.hidden % 4 == 0, "moe_combine: hidden size ", p.hidden, " is not a multiple of 4");
  const dim3 grid(static_cast<unsigned>(p.tokens),
                  static_cast<unsigned>((p.hidden / 4 + kCombineThreads - 1) / kCombineThreads));
  switch (p.out_dtype) {
    case DType::kBF16:
      launch_kernel(combine_kernel<__nv_bfloat16>, grid, kCombineThreads, 0, stream, p, trigger_first(kTriggerCombine));
      break;
    case DType::kF32:
      launch_kernel(combine_kernel<float>, grid, kCombineThreads, 0, stream, p, trigger_first(kTriggerCombine));
      break;
    default:
      fail("moe_combine: the output must be BF16 or F32, not ", dtype_name(p.out_dtype));
  }
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
