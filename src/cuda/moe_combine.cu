// Weighted combine: out[t] (BF16 or F32) = Σ_k weight[t, k] · Σ_split down[split][row_pos[t, k]] (alone,
// or fused with the residual add and norms after it);
// and the prefill path's windowed form with the activation and weight scales applied here. Each
// kernel is instantiated for a BF16 output (one GPU) and an F32 one (a tensor-parallel partial sum).
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/moe_combine.h"
#include "cuda/ptx.cuh"
#include "cuda/row_norm.cuh"
#include "cuda/vec8.cuh"

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
constexpr int kCombineThreads = 32;

// Grid (T, H / 128): each thread sums 4 consecutive columns over the top-k rows and the K splits
// (in that order). Out: __nv_bfloat16 or float.
template <typename Out>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const __grid_constant__ CombineArgs p) {
  const int64_t t = blockIdx.x;
  const int64_t h4 = static_cast<int64_t>(blockIdx.y) * kCombineThreads + threadIdx.x;  // column / 4
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
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

// One block a token, laid out as rms_norm_kernel (row_norm.cuh): thread i combines units i, i +
// blockDim, ... of the token's row (combine_kernel's sums, in its order) into registers, then the
// post-norm (kPost), the residual add and the norm.
template <int kUnits, bool kPost>
__global__ void __launch_bounds__(512)
    combine_add_rms_norm_kernel(const __grid_constant__ CombineArgs p, const __grid_constant__ CombineNormArgs n) {
  __shared__ float warp_sums[32];
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t t = blockIdx.x, H = p.hidden, units = H / kVec;
  const auto* weight = static_cast<const __nv_bfloat16*>(n.weight);
  const auto* post_weight = static_cast<const __nv_bfloat16*>(n.post_weight);
  float* x = n.residual + t * H;
  float v[kUnits][kVec];
  uint4 w_raw[kUnits] = {}, post_raw[kUnits] = {};
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (unit >= units) continue;
    w_raw[u] = *reinterpret_cast<const uint4*>(weight + unit * kVec);
    if constexpr (kPost) post_raw[u] = *reinterpret_cast<const uint4*>(post_weight + unit * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[u][j] = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int64_t row = p.row_pos[t * p.top_k + k];
      const float w = p.topk_weights[t * p.top_k + k];
#pragma unroll 4
      for (int64_t s = 0; s < p.splits; ++s) {
        float d[kVec];
        load8(p.down + (s * p.max_rows + row) * H + unit * kVec, d);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[u][j] = __fmaf_rn(w, d[j], v[u][j]);
      }
    }
  }
  if constexpr (kPost) {  // rms_norm(y) · post_weight, rounded to BF16
    float squares = 0.0f;
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
      if (u * static_cast<int64_t>(blockDim.x) + threadIdx.x < units) squares = add_squares(squares, v[u]);
    const float inv = inverse_rms(block_sum(squares, warp_sums), H, n.eps);
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
      if (u * static_cast<int64_t>(blockDim.x) + threadIdx.x < units) scale_unit_bf16(v[u], inv, post_raw[u]);
  }
  float squares = 0.0f;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (unit >= units) continue;
    float r[kVec];
    load8(x + unit * kVec, r);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[u][j] = r[j] + v[u][j];
    store8(x + unit * kVec, v[u]);
    squares = add_squares(squares, v[u]);
  }
  const float inv = inverse_rms(block_sum(squares, warp_sums), H, n.eps);
  auto* out = static_cast<__nv_bfloat16*>(n.out) + t * H;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (unit >= units) continue;
    float o[kVec];
    scale_unit(v[u], inv, w_raw[u], o);
    store8(out + unit * kVec, o);
  }
}

template <int kUnits>
void launch_combine_norm(const CombineArgs& p, const CombineNormArgs& n, int threads, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(p.tokens);
  if (n.post_weight != nullptr)
    launch_kernel(combine_add_rms_norm_kernel<kUnits, true>, blocks, threads, 0, stream, p, n);
  else
    launch_kernel(combine_add_rms_norm_kernel<kUnits, false>, blocks, threads, 0, stream, p, n);
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

void moe_combine_add_rms_norm(const CombineArgs& p, const CombineNormArgs& n, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  check(p.hidden % kVec == 0 && aligned(p.down) && aligned(n.residual) && aligned(n.weight) && aligned(n.out) &&
            (n.post_weight == nullptr || aligned(n.post_weight)),
        "moe_combine_add_rms_norm: hidden size ", p.hidden, " is not a multiple of ", kVec,
        " or a tensor is not 16-byte aligned");
  const RowNormShape shape = row_norm_shape(p.hidden);
  switch (shape.units_per_thread) {
    case 1: launch_combine_norm<1>(p, n, shape.threads, stream); break;
    case 2: launch_combine_norm<2>(p, n, shape.threads, stream); break;
    case 4: launch_combine_norm<4>(p, n, shape.threads, stream); break;
    default: launch_combine_norm<8>(p, n, shape.threads, stream); break;
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
      launch_kernel(combine_kernel<__nv_bfloat16>, grid, kCombineThreads, 0, stream, p);
      break;
    case DType::kF32:
      launch_kernel(combine_kernel<float>, grid, kCombineThreads, 0, stream, p);
      break;
    default:
      fail("moe_combine: the output must be BF16 or F32, not ", dtype_name(p.out_dtype));
  }
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
