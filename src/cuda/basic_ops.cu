// Embedding, RMSNorm, residual add and rotary embedding kernels (BF16 activations, fp32 math). RMSNorm
// and the residual add also read an F32 input: a tensor-parallel sum, rounded to BF16 as it is read.
#include <cuda_bf16.h>

#include "cuda/basic_ops.h"
#include "cuda/cuda_check.h"

namespace nibble::cuda {
namespace {

using bf16 = __nv_bfloat16;

// An input activation as an op reads it: BF16 as stored; an F32 tensor-parallel sum rounded to BF16
// first, the value one GPU's op would have stored there.
__device__ inline float activation_value(bf16 v) { return __bfloat162float(v); }
__device__ inline float activation_value(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__global__ void embedding_kernel(const int32_t* ids, const bf16* table, bf16* out, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const bf16* row = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) out[t * hidden + h] = row[h];
}

__global__ void gather_kernel(const bf16* x, const int32_t* rows, bf16* out, int64_t hidden) {
  const int64_t r = blockIdx.x, row = rows[r];
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) out[r * hidden + h] = x[row * hidden + h];
}

// In: BF16 or F32 (T, H); out BF16 (T, H).
template <typename In>
__global__ void rms_norm_kernel(const In* x, const bf16* weight, float eps, bf16* out, int64_t hidden) {
  __shared__ float partial[32];
  const int64_t t = blockIdx.x;
  const In* row = x + t * hidden;
  float sum = 0.0f;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    const float v = activation_value(row[h]);
    sum += v * v;
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += partial[w];
    partial[0] = 1.0f / sqrtf(total / static_cast<float>(hidden) + eps);
  }
  __syncthreads();
  const float inv = partial[0];
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x)
    out[t * hidden + h] = __float2bfloat16_rn(activation_value(row[h]) * inv * __bfloat162float(weight[h]));
}

// x BF16 += y (BF16 or F32), summed in fp32 and rounded once.
template <typename Y>
__global__ void add_kernel(bf16* x, const Y* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + activation_value(y[i]));
}

__global__ void scale_bf16_kernel(bf16* x, float factor, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * factor);
}

__global__ void scale_f32_kernel(float* x, float factor, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= factor;
}

// One block per token; threads over (head, i) pairs of the q and k heads.
__global__ void rope_kernel(bf16* qkv, const int32_t* positions, const float* inv_freq, int64_t heads,
                            int64_t head_dim, int64_t width) {
  const int64_t t = blockIdx.x, half = head_dim / 2;
  const auto pos = static_cast<float>(positions[t]);
  for (int64_t j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int64_t head = j / half, i = j % half;
    bf16* x = qkv + t * width + head * head_dim;
    const float angle = pos * inv_freq[i];
    const float c = cosf(angle), s = sinf(angle);
    const float x1 = __bfloat162float(x[i]), x2 = __bfloat162float(x[i + half]);
    x[i] = __float2bfloat16_rn(x1 * c - x2 * s);
    x[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
  }
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, cudaStream_t stream) {
  expect(table, DType::kBF16, {-1, -1}, "embedding table");
  expect(out, DType::kBF16, {ids.dim(0), table.dim(1)}, "embedding output");
  if (ids.dim(0) == 0) return;
  embedding_kernel<<<static_cast<unsigned>(ids.dim(0)), 256, 0, stream>>>(
      ids.data<int32_t>(), table.data<bf16>(), out.data<bf16>(), table.dim(1));
  cuda_check(cudaGetLastError());
}

void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out, cudaStream_t stream) {
  expect(out, DType::kBF16, {rows.dim(0), x.dim(1)}, "gather_rows output");
  if (rows.dim(0) == 0) return;
  gather_kernel<<<static_cast<unsigned>(rows.dim(0)), 256, 0, stream>>>(x.data<bf16>(), rows.data<int32_t>(),
                                                                          out.data<bf16>(), x.dim(1));
  cuda_check(cudaGetLastError());
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out, cudaStream_t stream) {
  check(x.dtype() == DType::kBF16 || x.dtype() == DType::kF32, "rms_norm input ", x.describe(),
        " is not BF16 or F32");
  expect(x, x.dtype(), {-1, weight.dim(0)}, "rms_norm input");
  expect(out, DType::kBF16, x.shape(), "rms_norm output");
  if (x.dim(0) == 0) return;
  const auto blocks = static_cast<unsigned>(x.dim(0));
  if (x.dtype() == DType::kF32)
    rms_norm_kernel<<<blocks, 256, 0, stream>>>(x.data<float>(), weight.data<bf16>(), eps, out.data<bf16>(),
                                                x.dim(1));
  else
    rms_norm_kernel<<<blocks, 256, 0, stream>>>(x.data<bf16>(), weight.data<bf16>(), eps, out.data<bf16>(),
                                                x.dim(1));
  cuda_check(cudaGetLastError());
}

void residual_add(Tensor& x, const Tensor& y, cudaStream_t stream) {
  check(x.numel() == y.numel() && x.dtype() == DType::kBF16 &&
            (y.dtype() == DType::kBF16 || y.dtype() == DType::kF32),
        "residual_add: ", x.describe(), " += ", y.describe());
  if (x.numel() == 0) return;
  const auto blocks = static_cast<unsigned>((x.numel() + 255) / 256);
  if (y.dtype() == DType::kF32)
    add_kernel<<<blocks, 256, 0, stream>>>(x.data<bf16>(), y.data<float>(), x.numel());
  else
    add_kernel<<<blocks, 256, 0, stream>>>(x.data<bf16>(), y.data<bf16>(), x.numel());
  cuda_check(cudaGetLastError());
}

void scale(Tensor& x, float factor, cudaStream_t stream) {
  if (x.numel() == 0) return;
  const auto blocks = static_cast<unsigned>((x.numel() + 255) / 256);
  if (x.dtype() == DType::kF32)
    scale_f32_kernel<<<blocks, 256, 0, stream>>>(x.data<float>(), factor, x.numel());
  else if (x.dtype() == DType::kBF16)
    scale_bf16_kernel<<<blocks, 256, 0, stream>>>(x.data<bf16>(), factor, x.numel());
  else
    fail("scale: ", x.describe(), " is not BF16 or F32");
  cuda_check(cudaGetLastError());
}

void rope(Tensor& qkv, const Tensor& positions, const Tensor& inv_freq, const AttentionParams& p,
          cudaStream_t stream) {
  const int64_t width = (p.num_heads + 2 * p.num_kv_heads) * p.head_dim;
  expect(qkv, DType::kBF16, {-1, width}, "rope qkv");
  if (qkv.dim(0) == 0) return;
  rope_kernel<<<static_cast<unsigned>(qkv.dim(0)), 256, 0, stream>>>(
      qkv.data<bf16>(), positions.data<int32_t>(), inv_freq.data<float>(), p.num_heads + p.num_kv_heads, p.head_dim,
      width);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
