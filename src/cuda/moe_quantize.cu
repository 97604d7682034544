// Per-row FP8 quantization kernels: one block per row (quantize) or a cluster of blocks per row
// (activation), the row staged in shared memory. Optionally gathered (quantize) or scaled per row and
// channel (activation) for the prefill path.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/activation.cuh"
#include "cuda/cuda_check.h"
#include "cuda/fp8_rows.cuh"
#include "cuda/kernel_attributes.h"
#include "cuda/moe_quantize.h"
#include "model/communicator.h"

namespace nibble::cuda {
namespace {

namespace cg = cooperative_groups;

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

// Activation rows split over a thread-block cluster: block q of a row's cluster takes the 64-wide
// blocks [q·per, (q + 1)·per) of its columns, so few rows (decode: T·top-k of them) still spread
// their split-K partial sums (the bulk of the reads) over 8 SMs a row. The row's amax is the max of
// the blocks' amaxes, exchanged through distributed shared memory; every value, code, scale and sum
// is computed as the one-block-a-row kernel did (a max has no rounding, sums stay per 64-block).
constexpr int kActThreads = 256;
constexpr int kActCluster = 8;  // the portable cluster size
constexpr int64_t kActMaxCols = kMaxCols / kActCluster;

__global__ void __launch_bounds__(kActThreads) activation_kernel(const __grid_constant__ ActivationArgs p) {
  __shared__ __align__(16) float values[kActMaxCols];  // this block's columns, read as float4
  __shared__ float reduce[32];
  __shared__ float block_amax, row_amax, unused_scale;
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t I = p.intermediate, row_blocks = I / kRowBlock;
  const auto C = static_cast<int64_t>(cluster.num_blocks()), q = static_cast<int64_t>(cluster.block_rank());
  const int64_t r = blockIdx.x / C, per = (row_blocks + C - 1) / C;
  const int64_t col0 = min(row_blocks, q * per) * kRowBlock, cols = min(row_blocks, (q + 1) * per) * kRowBlock - col0;
  uint8_t* codes = p.codes + r * I + col0;
  float* sums = p.sums + r * (I / kRowBlock) + col0 / kRowBlock;
  float* scale_out = q == 0 ? p.scale + r : &unused_scale;  // block 0 of the cluster writes the row's scale
  const float4* channel = nullptr;  // (2I / 4) this row's expert's scales, when the product is unscaled
  float row_scale = 1.0f;
  if (p.row_scale != nullptr) {
    const int64_t e = p.row_expert[r];
    if (e < 0) {  // the whole cluster returns here, before any exchange
      if (p.amax_out != nullptr) {
        if (q == 0 && threadIdx.x == 0) p.amax_out[r] = 0.0f;
        return;
      }
      return write_zero_row(codes, cols, scale_out, sums);
    }
    channel = reinterpret_cast<const float4*>(p.channel_scale + e * 2 * I);
    row_scale = p.row_scale[r];
  }
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < cols / 4; i += blockDim.x) {  // 4 columns a thread
    const int64_t c = col0 / 4 + i;                                // the float4's index in the row
    float4 gate = {0.0f, 0.0f, 0.0f, 0.0f}, up = gate;
#pragma unroll 4
    for (int64_t s = 0; s < p.splits; ++s) {
      const auto* row = reinterpret_cast<const float4*>(p.gate_up + (s * p.max_rows + r) * 2 * I);
      const float4 g = row[c], u = row[I / 4 + c];
      gate = {gate.x + g.x, gate.y + g.y, gate.z + g.z, gate.w + g.w};
      up = {up.x + u.x, up.y + u.y, up.z + u.z, up.w + u.w};
    }
    if (channel != nullptr) {
      const float4 sg = channel[c], su = channel[I / 4 + c];
      gate = {gate.x * row_scale * sg.x, gate.y * row_scale * sg.y, gate.z * row_scale * sg.z,
              gate.w * row_scale * sg.w};
      up = {up.x * row_scale * su.x, up.y * row_scale * su.y, up.z * row_scale * su.z, up.w * row_scale * su.w};
    }
    const float4 v = {activate(p.activation, gate.x) * up.x, activate(p.activation, gate.y) * up.y,
                      activate(p.activation, gate.z) * up.z, activate(p.activation, gate.w) * up.w};
    reinterpret_cast<float4*>(values)[i] = v;
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  // The block's amax, then the row's over the cluster's blocks.
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if (threadIdx.x % 32 == 0) reduce[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) amax = fmaxf(amax, reduce[w]);
    block_amax = amax;
  }
  cluster.sync();  // every block's amax (and this block's values) written
  if (threadIdx.x < 32) {
    float m = threadIdx.x < C ? *cluster.map_shared_rank(&block_amax, static_cast<unsigned>(threadIdx.x)) : 0.0f;
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if (threadIdx.x == 0) row_amax = m;
  }
  __syncthreads();
  if (p.amax_out != nullptr) {  // the first pass under tensor parallelism: only the row's amax
    if (q == 0 && threadIdx.x == 0) p.amax_out[r] = row_amax;
  } else {
    // The dynamic formula, over every rank's slice when the reduced amax is given.
    const float scale = fmaxf(p.amax_in != nullptr ? p.amax_in[r] : row_amax, 1e-12f) / 448.0f;
    quantize_row_fp8(values, cols, codes, scale_out, sums, reduce, scale);
  }
  cluster.sync();  // no block leaves while another may still read its block_amax
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
  check(p.intermediate > 0 && p.intermediate % kRowBlock == 0 && p.intermediate <= kMaxCols,
        "activation_quantize_fp8: ", p.intermediate, " columns");
  if (p.rows == 0) return;
  // A cluster of up to 8 blocks a row (fewer for a row of fewer 64-blocks).
  const auto cluster = static_cast<unsigned>(std::min<int64_t>(kActCluster, p.intermediate / kRowBlock));
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim = {cluster, 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(p.rows) * cluster);
  config.blockDim = dim3(kActThreads);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  cuda_check(cudaLaunchKernelEx(&config, activation_kernel, p));
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
