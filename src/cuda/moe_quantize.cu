// Per-row FP8 quantization kernels: one block per row, the row staged in shared memory. Optionally
// gathered (quantize) or scaled per row and channel (activation) for the prefill path.
#include <cuda_bf16.h>

#include "cuda/activation.cuh"
#include "cuda/cuda_check.h"
#include "cuda/fp8_rows.cuh"
#include "cuda/kernel_attributes.h"
#include "cuda/moe_quantize.h"
#include "model/communicator.h"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 1024;  // one block a row: as many threads as can share the row's loads
constexpr int64_t kMaxCols = 32768;

// A padding row of the prefill path: zero codes, scale and sums (the whole block takes this branch).
__device__ void write_zero_row(uint8_t* codes, int64_t cols, float* scale, float* sums) {
  for (int64_t i = threadIdx.x; i < cols / 16; i += blockDim.x) reinterpret_cast<uint4*>(codes)[i] = {0, 0, 0, 0};
  for (int64_t i = threadIdx.x; i < cols / kRowBlock; i += blockDim.x) sums[i] = 0.0f;
  if (threadIdx.x == 0) *scale = 0.0f;
}

// The first pass under tensor parallelism: the amax of the row staged in `values` (all threads call).
__device__ void write_row_amax(const float* values, int64_t cols, float* amax_out, float* reduce) {
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) amax = fmaxf(amax, fabsf(values[i]));
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if (threadIdx.x % 32 == 0) reduce[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) amax = fmaxf(amax, reduce[w]);
    *amax_out = amax;
  }
}

__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const __grid_constant__ QuantizeRowsArgs p) {
  extern __shared__ float values[];
  __shared__ float reduce[32];
  const int64_t r = blockIdx.x;
  const int64_t src = p.src_row == nullptr ? r : p.src_row[r];
  if (src < 0) return write_zero_row(p.codes + r * p.cols, p.cols, p.scale + r, p.sums + r * (p.cols / kRowBlock));
  const auto* x = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.x) + src * p.cols);
  for (int64_t i = threadIdx.x; i < p.cols / 8; i += blockDim.x) {  // 8 bf16 a load
    const uint4 v = x[i];
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      values[8 * i + 2 * j] = f.x;
      values[8 * i + 2 * j + 1] = f.y;
    }
  }
  __syncthreads();
  if (p.amax_out != nullptr) return write_row_amax(values, p.cols, p.amax_out + r, reduce);
  const float scale = p.amax_in != nullptr ? fmaxf(p.amax_in[r], 1e-12f) / 448.0f : p.static_scale;
  quantize_row_fp8(values, p.cols, p.codes + r * p.cols, p.scale + r,
                   p.sums != nullptr ? p.sums + r * (p.cols / kRowBlock) : nullptr, reduce, scale);
}

__global__ void __launch_bounds__(kThreads) activation_kernel(const __grid_constant__ ActivationArgs p) {
  extern __shared__ float values[];
  __shared__ float reduce[32];
  const int64_t r = blockIdx.x, I = p.intermediate;
  const float4* channel = nullptr;  // (2I / 4) this row's expert's scales, when the product is unscaled
  float row_scale = 1.0f;
  if (p.row_scale != nullptr) {
    const int64_t e = p.row_expert[r];
    if (e < 0) {
      if (p.amax_out != nullptr) {
        if (threadIdx.x == 0) p.amax_out[r] = 0.0f;
        return;
      }
      return write_zero_row(p.codes + r * I, I, p.scale + r, p.sums + r * (I / kRowBlock));
    }
    channel = reinterpret_cast<const float4*>(p.channel_scale + e * 2 * I);
    row_scale = p.row_scale[r];
  }
  for (int64_t i = threadIdx.x; i < I / 4; i += blockDim.x) {  // 4 columns a thread
    float4 gate = {0.0f, 0.0f, 0.0f, 0.0f}, up = gate;
    for (int64_t s = 0; s < p.splits; ++s) {
      const auto* row = reinterpret_cast<const float4*>(p.gate_up + (s * p.max_rows + r) * 2 * I);
      const float4 g = row[i], u = row[I / 4 + i];
      gate = {gate.x + g.x, gate.y + g.y, gate.z + g.z, gate.w + g.w};
      up = {up.x + u.x, up.y + u.y, up.z + u.z, up.w + u.w};
    }
    if (channel != nullptr) {
      const float4 cg = channel[i], cu = channel[I / 4 + i];
      gate = {gate.x * row_scale * cg.x, gate.y * row_scale * cg.y, gate.z * row_scale * cg.z,
              gate.w * row_scale * cg.w};
      up = {up.x * row_scale * cu.x, up.y * row_scale * cu.y, up.z * row_scale * cu.z, up.w * row_scale * cu.w};
    }
    values[4 * i] = activate(p.activation, gate.x) * up.x;
    values[4 * i + 1] = activate(p.activation, gate.y) * up.y;
    values[4 * i + 2] = activate(p.activation, gate.z) * up.z;
    values[4 * i + 3] = activate(p.activation, gate.w) * up.w;
  }
  __syncthreads();
  // The first pass under tensor parallelism: only the row's amax.
  if (p.amax_out != nullptr) return write_row_amax(values, I, p.amax_out + r, reduce);
  // The scale of the dynamic formula, from the amax over every rank's slice when one is given.
  const float scale = p.amax_in != nullptr ? fmaxf(p.amax_in[r], 1e-12f) / 448.0f : 0.0f;
  quantize_row_fp8(values, I, p.codes + r * I, p.scale + r, p.sums + r * (I / kRowBlock), reduce, scale);
}

template <typename Kernel>
void set_smem(Kernel kernel) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<int>(kMaxCols * sizeof(float)));
}

}  // namespace

void quantize_rows_fp8(const QuantizeRowsArgs& p, cudaStream_t stream) {
  check(p.cols % (p.sums != nullptr ? kRowBlock : 16) == 0 && p.cols <= kMaxCols, "quantize_rows_fp8: ", p.cols,
        " columns");
  set_smem(quantize_rows_kernel);
  if (p.rows == 0) return;
  quantize_rows_kernel<<<static_cast<unsigned>(p.rows), kThreads, p.cols * sizeof(float), stream>>>(p);
  cuda_check(cudaGetLastError());
}

void activation_quantize_fp8(const ActivationArgs& p, cudaStream_t stream) {
  check(p.intermediate % kRowBlock == 0 && p.intermediate <= kMaxCols, "activation_quantize_fp8: ",
        p.intermediate, " columns");
  set_smem(activation_kernel);
  if (p.rows == 0) return;
  activation_kernel<<<static_cast<unsigned>(p.rows), kThreads, p.intermediate * sizeof(float), stream>>>(p);
  cuda_check(cudaGetLastError());
}

void activation_quantize_fp8(const ActivationArgs& p, Communicator* communicator, Tensor& amax,
                             cudaStream_t stream) {
  if (communicator == nullptr) return activation_quantize_fp8(p, stream);
  check(amax.dtype() == DType::kF32 && amax.numel() >= p.rows, "activation_quantize_fp8: amax scratch too small");
  ActivationArgs pass = p;
  pass.amax_out = amax.data<float>();
  activation_quantize_fp8(pass, stream);
  Tensor rows_amax = amax.slice(0, p.rows);
  communicator->all_reduce_max(rows_amax);
  pass.amax_out = nullptr;
  pass.amax_in = amax.data<float>();
  activation_quantize_fp8(pass, stream);
}

}  // namespace nibble::cuda
