// Embedding, RMSNorm (alone or after the residual add), residual add, scale and rotary embedding
// kernels: fp32 math, the F32 residual stream and BF16 activations of ops.h. Built for decode latency
// (a few hundred KB an op): every thread moves 16-byte vectors of 8 elements, RMSNorm keeps its row in
// registers and reads it once (row_norm.cuh), RoPE runs one thread per 8 rotated pairs of a head. The arithmetic is
// the CPU twins' (src/cpu).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/basic_ops.h"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"
#include "cuda/rope.cuh"
#include "cuda/row_norm.cuh"
#include "cuda/vec8.cuh"

namespace nibble::cuda {
namespace {

using bf16 = __nv_bfloat16;

// out F32 (T, H) = table[ids] BF16 (V, H); grid (T, units / blockDim), one 8-element unit a thread.
__global__ void embedding_kernel(const int32_t* ids, const bf16* table, float* out, int64_t hidden) {
  const int64_t t = blockIdx.x, h = (blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kVec;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (h >= hidden) return;
  float v[kVec];
  load8(table + static_cast<int64_t>(ids[t]) * hidden + h, v);
  store8(out + t * hidden + h, v);
}

__global__ void gather_kernel(const bf16* x, const int32_t* rows, bf16* out, int64_t hidden) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t r = blockIdx.x, row = rows[r];
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) out[r * hidden + h] = x[row * hidden + h];
}

// out BF16 (T, H) = x / rms(x) × weight for x F32 (T, H). One block a row; thread i holds units i,
// i + blockDim, ... (kUnits at most, 8 elements each) of x and of the weight in registers from the
// one read (both loads issued before the reduction) to the store. inv = 1 / sqrt(Σx² / H + eps) as
// the CPU computes it; Σ over a warp-shuffle tree. With y (F32 or BF16, (T, H)) the residual add
// comes first: x += y is stored back to x_sum (x itself) and normalized, the same fp32 values as add
// then rms_norm. out may alias y: every y element is read before the block's barrier and written
// after it by the thread that read it.
template <int kUnits, typename Y>
__global__ void __launch_bounds__(512) rms_norm_kernel(const float* x, const Y* y, float* x_sum, const bf16* weight,
                                                       float eps, bf16* out, int64_t hidden, bool trigger_first) {
  __shared__ float warp_sums[32];
  ptx::dependency_wait(trigger_first);
  const int64_t units = hidden / kVec;
  const float* row = x + blockIdx.x * hidden;
  float v[kUnits][kVec];
  uint4 w_raw[kUnits] = {};  // 8 BF16 weights a unit
  float sum = 0.0f;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (unit < units) {
      load8(row + unit * kVec, v[u]);
      w_raw[u] = *reinterpret_cast<const uint4*>(weight + unit * kVec);
      if (y != nullptr) {
        float add[kVec];
        load8(y + blockIdx.x * hidden + unit * kVec, add);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[u][j] += add[j];
        store8(x_sum + blockIdx.x * hidden + unit * kVec, v[u]);
      }
      sum = add_squares(sum, v[u]);
    }
  }
  const float inv = inverse_rms(block_sum(sum, warp_sums), hidden, eps);
  bf16* out_row = out + blockIdx.x * hidden;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (unit < units) {
      float w[kVec];
      scale_unit(v[u], inv, w_raw[u], w);
      store8(out_row + unit * kVec, w);
    }
  }
}

// x F32 += y (F32 or BF16) over n elements, 8 a thread.
template <typename Y>
__global__ void add_kernel(float* x, const Y* y, int64_t n) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kVec;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (i >= n) return;
  float a[kVec], b[kVec];
  load8(x + i, a);
  load8(y + i, b);
#pragma unroll
  for (int j = 0; j < kVec; ++j) a[j] += b[j];
  store8(x + i, a);
}

__global__ void scale_kernel(float* x, float factor, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (i < n) x[i] *= factor;
}

// Neox rotary embedding on qkv BF16 (T, width), in place: q heads then k heads, `heads` of them, each
// rotating pairs (i, i + half). One thread per (token, head, 8 consecutive i): two 16-byte loads and
// stores, 8 sines and cosines.
__global__ void rope_kernel(bf16* qkv, const int32_t* positions, const float* inv_freq, int64_t tokens,
                            int64_t heads, int64_t head_dim, int64_t width) {
  const int64_t half = head_dim / 2, groups = half / kVec;
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (index >= tokens * heads * groups) return;
  const int64_t t = index / (heads * groups), head = index / groups % heads, i = index % groups * kVec;
  float x1[kVec], x2[kVec];
  rope_rotate8(qkv + t * width + head * head_dim + i, half, inv_freq + i, static_cast<float>(positions[t]), x1,
               x2);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

unsigned blocks_for(int64_t threads_total, int threads) {
  return static_cast<unsigned>((threads_total + threads - 1) / threads);
}

// y: nullptr (rms_norm alone) or the F32/BF16 tensor added to x first.
template <int kUnits>
void launch_rms_norm(const Tensor& x, const Tensor* y, const Tensor& weight, float eps, Tensor& out, int threads,
                     cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(x.dim(0));
  float* x_sum = y == nullptr ? nullptr : x.data<float>();  // x += y is stored back into x
  const bool first = trigger_first(kTriggerNorm);
  if (y == nullptr || y->dtype() == DType::kF32)
    launch_kernel(rms_norm_kernel<kUnits, float>, blocks, threads, 0, stream, x.data<float>(),
                  y == nullptr ? nullptr : y->data<float>(), x_sum, weight.data<bf16>(), eps, out.data<bf16>(), x.dim(1),
                  first);
  else
    launch_kernel(rms_norm_kernel<kUnits, bf16>, blocks, threads, 0, stream, x.data<float>(), y->data<bf16>(), x_sum,
                  weight.data<bf16>(), eps, out.data<bf16>(), x.dim(1), first);
}

// rms_norm, after x += y when y is given.
void launch_norm(const Tensor& x, const Tensor* y, const Tensor& weight, float eps, Tensor& out,
                 cudaStream_t stream) {
  expect(weight, DType::kBF16, {-1}, "rms_norm weight");
  expect(x, DType::kF32, {-1, weight.dim(0)}, "rms_norm input");
  expect(out, DType::kBF16, x.shape(), "rms_norm output");
  const int64_t H = x.dim(1);
  check(H > 0 && H % kVec == 0 && aligned16(x.raw()) && aligned16(weight.raw()) && aligned16(out.raw()),
        "rms_norm: hidden size ", H, " is not a multiple of ", kVec, " or a tensor is not 16-byte aligned");
  if (y != nullptr) {
    check(y->dtype() == DType::kF32 || y->dtype() == DType::kBF16, "add_rms_norm: y ", y->describe(),
          " is not F32 or BF16");
    expect(*y, y->dtype(), x.shape(), "add_rms_norm y");
    check(aligned16(y->raw()), "add_rms_norm: y is not 16-byte aligned");
  }
  const RowNormShape shape = row_norm_shape(H);
  if (x.dim(0) == 0) return;
  switch (shape.units_per_thread) {
    case 1: launch_rms_norm<1>(x, y, weight, eps, out, shape.threads, stream); break;
    case 2: launch_rms_norm<2>(x, y, weight, eps, out, shape.threads, stream); break;
    case 4: launch_rms_norm<4>(x, y, weight, eps, out, shape.threads, stream); break;
    default: launch_rms_norm<8>(x, y, weight, eps, out, shape.threads, stream); break;
  }
  cuda_check(cudaGetLastError());
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, cudaStream_t stream) {
  expect(table, DType::kBF16, {-1, -1}, "embedding table");
  expect(out, DType::kF32, {ids.dim(0), table.dim(1)}, "embedding output");
  const int64_t H = table.dim(1);
  check(H % kVec == 0 && aligned16(table.raw()) && aligned16(out.raw()), "embedding: hidden size ", H,
        " is not a multiple of ", kVec, " or a tensor is not 16-byte aligned");
  if (ids.dim(0) == 0) return;
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>(ids.dim(0)), blocks_for(H / kVec, kThreads));
  launch_kernel(embedding_kernel, grid, kThreads, 0, stream, ids.data<int32_t>(), table.data<bf16>(), out.data<float>(),
                H);
  cuda_check(cudaGetLastError());
}

void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out, cudaStream_t stream) {
  expect(out, DType::kBF16, {rows.dim(0), x.dim(1)}, "gather_rows output");
  if (rows.dim(0) == 0) return;
  launch_kernel(gather_kernel, static_cast<unsigned>(rows.dim(0)), 256, 0, stream, x.data<bf16>(), rows.data<int32_t>(),
                out.data<bf16>(), x.dim(1));
  cuda_check(cudaGetLastError());
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out, cudaStream_t stream) {
  launch_norm(x, nullptr, weight, eps, out, stream);
}

void add_rms_norm(Tensor& x, const Tensor& y, const Tensor& weight, float eps, Tensor& out, cudaStream_t stream) {
  launch_norm(x, &y, weight, eps, out, stream);
}

void residual_add(Tensor& x, const Tensor& y, cudaStream_t stream) {
  const int64_t n = x.numel();
  check(n == y.numel() && x.dtype() == DType::kF32 && (y.dtype() == DType::kF32 || y.dtype() == DType::kBF16),
        "residual_add: ", x.describe(), " += ", y.describe(), " (x F32, y F32 or BF16)");
  check(n % kVec == 0 && aligned16(x.raw()) && aligned16(y.raw()), "residual_add: ", n,
        " elements are not a multiple of ", kVec, " or a tensor is not 16-byte aligned");
  if (n == 0) return;
  constexpr int kThreads = 128;
  const unsigned blocks = blocks_for(n / kVec, kThreads);
  if (y.dtype() == DType::kF32)
    launch_kernel(add_kernel<float>, blocks, kThreads, 0, stream, x.data<float>(), y.data<float>(), n);
  else
    launch_kernel(add_kernel<bf16>, blocks, kThreads, 0, stream, x.data<float>(), y.data<bf16>(), n);
  cuda_check(cudaGetLastError());
}

void scale(Tensor& x, float factor, cudaStream_t stream) {
  expect(x, DType::kF32, x.shape(), "scale input");
  if (x.numel() == 0) return;
  launch_kernel(scale_kernel, blocks_for(x.numel(), 256), 256, 0, stream, x.data<float>(), factor, x.numel());
  cuda_check(cudaGetLastError());
}

void rope(Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const AttentionParams& p,
          cudaStream_t stream) {
  const int64_t D = p.head_dim, width = (p.num_heads + 2 * p.num_kv_heads) * D, heads = p.num_heads + p.num_kv_heads;
  expect(qkv, DType::kBF16, {-1, width}, "rope qkv");
  expect(inv_freq, DType::kF32, {D / 2}, "rope inv_freq");
  check(D % (2 * kVec) == 0 && aligned16(qkv.raw()) && aligned16(inv_freq.raw()), "rope: head_dim ", D,
        " is not a multiple of ", 2 * kVec, " or a tensor is not 16-byte aligned");
  const int64_t T = qkv.dim(0);
  if (T == 0) return;
  constexpr int kThreads = 128;
  launch_kernel(rope_kernel, blocks_for(T * heads * (D / 2 / kVec), kThreads), kThreads, 0, stream, qkv.data<bf16>(),
                positions.data<int32_t>(), inv_freq.data<float>(), T, heads, D, width);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
