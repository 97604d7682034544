// Per-row FP8 quantization kernels: one block per row held in registers (quantize), or a cluster of
// blocks per row staged in shared memory (activation). Optionally gathered (quantize) or scaled per row and
// channel (activation) for the prefill path.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "cuda/activation.cuh"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/env_setting.h"
#include "cuda/fp8_rows.cuh"
#include "cuda/launch.h"
#include "cuda/moe_quantize.h"
#include "cuda/ptx.cuh"
#include "model/communicator.h"

namespace nibble::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int64_t kMaxCols = 32768;

// A padding row of the prefill path: zero codes, scale and sums (the whole block takes this branch).
__device__ void write_zero_row(uint8_t* codes, int64_t cols, float* scale, float* sums) {
  for (int64_t i = threadIdx.x; i < cols / 16; i += blockDim.x) reinterpret_cast<uint4*>(codes)[i] = {0, 0, 0, 0};
  for (int64_t i = threadIdx.x; sums != nullptr && i < cols / kRowBlock; i += blockDim.x) sums[i] = 0.0f;
  if (threadIdx.x == 0) *scale = 0.0f;
}

// Per-token quantization, one block a row held in registers: thread i loads units i, i + blockDim,
// ... (kUnits at most) of 8 BF16 values with one 16-byte load each, so that the row is read once and
// never staged. A 64-wide block of sums is 8 consecutive units: 8 consecutive lanes of one warp. The
// codes and the scale are the staged kernel's (a max has no rounding); the sums too, since any sum of
// 64 FP8 e4m3 values is exact in fp32 (multiples of 2^-9 below 2^15), whatever its order.
//
// Rows of more than 8 units a thread at 256 threads (over 16384 columns) take up to 512 threads in
// their own kernel (wide_quantize_rows_kernel): 16 units a thread put the row in local memory (896
// bytes of stack a thread, ptxas).
constexpr int kQuantThreads = 256;
constexpr int kQuantMaxThreads = 512;
constexpr int kQuantMaxUnits = 8;
static_assert(kMaxCols / 8 <= int64_t{kQuantMaxThreads} * kQuantMaxUnits, "the widest row fits one block");

// warp_amax: a float of shared memory a warp.
template <int kUnits>
__device__ void quantize_row(const QuantizeRowsArgs& p, float* warp_amax) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int64_t r = blockIdx.x, units = p.cols / 8;
  const int64_t src = p.src_row == nullptr ? r : p.src_row[r];
  uint8_t* codes = p.codes + r * p.cols;
  float* sums = p.sums != nullptr ? p.sums + r * (p.cols / kRowBlock) : nullptr;
  if (src < 0) return write_zero_row(codes, p.cols, p.scale + r, sums);
  const auto* x = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.x) + src * p.cols);
  float v[kUnits][8];
  float amax = 0.0f;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = u * int64_t{blockDim.x} + threadIdx.x;
    if (unit < units) {
      const uint4 raw = x[unit];
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // a BF16 is the upper half of its fp32 value
        v[u][2 * j] = __uint_as_float(words[j] << 16);
        v[u][2 * j + 1] = __uint_as_float(words[j] & 0xFFFF0000u);
        amax = fmaxf(amax, fmaxf(fabsf(v[u][2 * j]), fabsf(v[u][2 * j + 1])));
      }
    }
  }
  amax = block_amax(amax, warp_amax);
  if (p.amax_out != nullptr) {  // the first pass under tensor parallelism: only the row's amax
    if (threadIdx.x == 0) p.amax_out[r] = amax;
    return;
  }
  // The reduced amax over the ranks, else the static scale, else the dynamic formula.
  const float scale = p.amax_in != nullptr     ? fmaxf(p.amax_in[r], 1e-12f) / 448.0f
                      : p.static_scale > 0.0f ? p.static_scale
                                              : fmaxf(amax, 1e-12f) / 448.0f;
  const CodeCopies copies{.codes = p.sorted_codes, .rows = p.row_pos + r * p.top_k,
                          .count = p.sorted_codes != nullptr ? p.top_k : 0, .cols = p.cols};
  store_units_fp8(v, units, scale, codes, sums, copies);
  if (threadIdx.x == 0) p.scale[r] = scale;
}

template <int kUnits>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(const __grid_constant__ QuantizeRowsArgs p) {
  __shared__ float warp_amax[kQuantThreads / 32];
  quantize_row<kUnits>(p, warp_amax);
}

// (512, 1): without the block count ptxas kept the row in local memory here too.
__global__ void __launch_bounds__(kQuantMaxThreads, 1) wide_quantize_rows_kernel(const __grid_constant__ QuantizeRowsArgs p) {
  __shared__ float warp_amax[kQuantMaxThreads / 32];
  quantize_row<kQuantMaxUnits>(p, warp_amax);
}

template <int kUnits>
void launch_quantize_rows(const QuantizeRowsArgs& p, int threads, cudaStream_t stream) {
  launch_kernel(quantize_rows_kernel<kUnits>, static_cast<unsigned>(p.rows), threads, 0, stream, p);
}

// Activation rows split over a thread-block cluster: block q of a row's cluster takes the 64-wide
// blocks [q·per, (q + 1)·per) of its columns, so few rows (decode: T·top-k of them) still spread
// their split-K partial sums (the bulk of the reads) over 8 SMs a row. The row's amax is the max of
// the blocks' amaxes, exchanged through distributed shared memory; every value, code, scale and sum
// is computed as the one-block-a-row kernel did (a max has no rounding, sums stay per 64-block).
// act(gate) · up for float4 c of row r's halves: gate_up summed over the K splits and, when the
// product is unscaled (`channel`: this row's expert's scales), scaled by row_scale and the channels'.
// kOneSplit (p.splits == 1): no loop around the loads, so that a thread's loads of several float4 may
// be in flight together; the same values (0 + x, as the loop's first sum, turns -0 into +0). The
// one-split variants also take the activation as a template argument (kAct, an Activation; -1: p's at
// run time): a switch an element between the loads kept ptxas from issuing more than one float4 pair
// ahead (cuobjdump: about 400 instructions between pairs).
constexpr int kRuntimeActivation = -1;
// kAct for a product already activated (ActivationArgs::activated): the values are read as they are.
constexpr int kActivated = -2;

// kBf16 (one split only): the product's BF16 copy (ActivationArgs::gate_up_bf16), each value the
// float it widens to, so that the same values in F32 give the same codes bit for bit.
template <bool kOneSplit = false, int kAct = kRuntimeActivation, bool kBf16 = false>
__device__ inline float4 activated_float4(const ActivationArgs& p, int64_t r, int64_t c, const float4* channel,
                                          float row_scale) {
  static_assert(kOneSplit || !kBf16, "a BF16 product has one split");
  static_assert(kAct != kActivated || (kOneSplit && !kBf16), "an activated product has one F32 split");
  const int64_t I = p.intermediate;
  if constexpr (kAct == kActivated) {
    return reinterpret_cast<const float4*>(p.gate_up + r * I)[c];
  } else {
    float4 gate = {0.0f, 0.0f, 0.0f, 0.0f}, up = gate;
    // The float4 (4 columns) of gate and up for intermediate columns 4c..4c+3.
    const int64_t gi = p.interleaved ? 4 * (c / 2) + c % 2 : c, ui = p.interleaved ? gi + 2 : I / 4 + c;
    if constexpr (kBf16) {  // 4 BF16 a uint2, the lower half first; a BF16 is the upper half of its fp32
      const auto* row = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.gate_up_bf16) + r * 2 * I);
      const uint2 g = row[gi], u = row[ui];
      auto widen = [](uint2 w) {
        return float4{0.0f + __uint_as_float(w.x << 16), 0.0f + __uint_as_float(w.x & 0xFFFF0000u),
                      0.0f + __uint_as_float(w.y << 16), 0.0f + __uint_as_float(w.y & 0xFFFF0000u)};
      };
      gate = widen(g);
      up = widen(u);
    } else if constexpr (kOneSplit) {
      const auto* row = reinterpret_cast<const float4*>(p.gate_up + r * 2 * I);
      const float4 g = row[gi], u = row[ui];
      gate = {0.0f + g.x, 0.0f + g.y, 0.0f + g.z, 0.0f + g.w};
      up = {0.0f + u.x, 0.0f + u.y, 0.0f + u.z, 0.0f + u.w};
    } else {
#pragma unroll 4
      for (int64_t s = 0; s < p.splits; ++s) {
        const auto* row = reinterpret_cast<const float4*>(p.gate_up + (s * p.max_rows + r) * 2 * I);
        const float4 g = row[gi], u = row[ui];
        gate = {gate.x + g.x, gate.y + g.y, gate.z + g.z, gate.w + g.w};
        up = {up.x + u.x, up.y + u.y, up.z + u.z, up.w + u.w};
      }
    }
    if (channel != nullptr) {
      const float4 sg = channel[gi], su = channel[ui];
      gate = {gate.x * row_scale * sg.x, gate.y * row_scale * sg.y, gate.z * row_scale * sg.z,
              gate.w * row_scale * sg.w};
      up = {up.x * row_scale * su.x, up.y * row_scale * su.y, up.z * row_scale * su.z, up.w * row_scale * su.w};
    }
    const Activation act = kAct == kRuntimeActivation ? p.activation : static_cast<Activation>(kAct);
    return {activate(act, gate.x) * up.x, activate(act, gate.y) * up.y, activate(act, gate.z) * up.z,
            activate(act, gate.w) * up.w};
  }
}

// The activation kernels let the down GEMM launch before they wait for gate_up (launch.h: the one
// exception), so that its blocks take the SMs gate_up's blocks leave and start streaming weights
// there: its early copies no longer wait for gate_up to finish and this kernel to start. Not the first
// pass under tensor parallelism (amax_out), which a reduction of the amaxes follows. Measured on an
// H200 (bench/RESULTS.md, eighteenth session, Mixtral-8x7B W4A8 decode, ms a step, triggering after
// the wait / before): batch 1 3.50 / 3.41, batch 8 8.01 / 7.93; batch 32 and Grok-1's tp 2 rank
// unchanged.
__device__ inline void activation_dependency_wait(const ActivationArgs& p) {
  ptx::dependency_wait(p.amax_out == nullptr);
}

constexpr int kActThreads = 256;
constexpr int kActCluster = 8;  // the portable cluster size
constexpr int64_t kActMaxCols = kMaxCols / kActCluster;

template <bool kOneSplit, int kAct, bool kBf16 = false>
__global__ void __launch_bounds__(kActThreads) activation_kernel(const __grid_constant__ ActivationArgs p) {
  __shared__ __align__(16) float values[kActMaxCols];  // this block's columns, read as float4
  __shared__ float reduce[32], given_reduce[32];
  __shared__ float block_amax, row_amax, unused_scale;
  activation_dependency_wait(p);
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
#pragma unroll(kOneSplit ? 4 : 1)
  for (int64_t i = threadIdx.x; i < cols / 4; i += blockDim.x) {  // 4 columns a thread
    const float4 v = activated_float4<kOneSplit, kAct, kBf16>(p, r, col0 / 4 + i, channel, row_scale);  // this block's float4 i
    reinterpret_cast<float4*>(values)[i] = v;
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  if (p.amax_out == nullptr && (p.amax_in != nullptr || p.part_amax != nullptr)) {
    // The row's amax given (reduced over the ranks, or in parts by gate_up's epilogue): no exchange
    // between the cluster's blocks. block_amax's barrier also orders this block's values.
    float given = 0.0f;
    for (int64_t i = threadIdx.x; p.amax_in == nullptr && i < p.amax_parts; i += blockDim.x)
      given = fmaxf(given, p.part_amax[r * p.amax_parts + i]);
    given = p.amax_in != nullptr ? p.amax_in[r] : cuda::block_amax(given, given_reduce);
    if (p.amax_in != nullptr) __syncthreads();
    quantize_row_fp8(values, cols, codes, scale_out, sums, reduce, fmaxf(given, 1e-12f) / 448.0f);
    return;
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
    quantize_row_fp8(values, cols, codes, scale_out, sums, reduce, fmaxf(row_amax, 1e-12f) / 448.0f);
  }
  cluster.sync();  // no block leaves while another may still read its block_amax
}

// Activation rows one block a row, held in registers (as quantize_rows_kernel): thread i takes the
// 8-column units i, i + blockDim, ... (kUnits at most) of the gate and up halves, so that a row's
// reads need no shared-memory staging and no cluster: one block-wide amax, then the codes and sums.
// Every value is computed as activation_kernel computes it (the same sums over the splits in order,
// the same scaling and activation), so the codes, scales and sums are that kernel's.
constexpr int kActRowThreads = 1024;
constexpr int64_t kActRowMaxUnits = 2 * kActRowThreads;  // I up to 16384
// Blocks of activation_rows_kernel an SM should hold: 1 (58 registers a thread, no spills, so one row
// an SM at a time, its amax reduction between its loads and its stores: about 2 TB/s at Mixtral's 1024
// tokens, bench/RESULTS.md); an experiment can build 2 (-DNIBBLE_DEFINES=NIBBLE_ACT_ROW_MIN_BLOCKS=2:
// 32 registers, 40 bytes of spills).
#ifndef NIBBLE_ACT_ROW_MIN_BLOCKS
#define NIBBLE_ACT_ROW_MIN_BLOCKS 1
#endif

template <int kUnits, bool kOneSplit, int kAct, bool kBf16 = false>
__global__ void __launch_bounds__(kActRowThreads, NIBBLE_ACT_ROW_MIN_BLOCKS) activation_rows_kernel(const __grid_constant__ ActivationArgs p) {
  __shared__ float warp_amax[kActRowThreads / 32];
  activation_dependency_wait(p);
  const int64_t r = blockIdx.x, I = p.intermediate, units = I / 8;
  uint8_t* codes = p.codes + r * I;
  float* sums = p.sums + r * (I / kRowBlock);
  const float4* channel = nullptr;  // (2I / 4) this row's expert's scales, when the product is unscaled
  float row_scale = 1.0f;
  if (p.row_scale != nullptr) {
    const int64_t e = p.row_expert[r];
    if (e < 0) {  // a padding row: the whole block returns here
      if (p.amax_out != nullptr) {
        if (threadIdx.x == 0) p.amax_out[r] = 0.0f;
        return;
      }
      return write_zero_row(codes, I, p.scale + r, sums);
    }
    channel = reinterpret_cast<const float4*>(p.channel_scale + e * 2 * I);
    row_scale = p.row_scale[r];
  }
  float v[kUnits][8];
  float amax = 0.0f;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = u * int64_t{blockDim.x} + threadIdx.x;
    if (unit >= units) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the unit's two float4 of columns
      const float4 a = activated_float4<kOneSplit, kAct, kBf16>(p, r, unit * 2 + h, channel, row_scale);  // the unit's float4 h
      float* out = &v[u][4 * h];
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
#pragma unroll
      for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(out[j]));
    }
  }
  amax = block_amax(amax, warp_amax);
  if (p.amax_out != nullptr) {  // the first pass under tensor parallelism: only the row's amax
    if (threadIdx.x == 0) p.amax_out[r] = amax;
    return;
  }
  // The dynamic formula, over every rank's slice when the reduced amax is given.
  const float scale = fmaxf(p.amax_in != nullptr ? p.amax_in[r] : amax, 1e-12f) / 448.0f;
  store_units_fp8(v, units, scale, codes, sums);
  if (threadIdx.x == 0) p.scale[r] = scale;
}

// Which activation kernel a call takes: ActivationArgs::kernel, else NIBBLE_ACTIVATION (cluster or
// rows), else the cluster kernel where its grid (kActCluster blocks a row) is at most one block an SM
// or the row kernel cannot take the row (I above 16384), the row kernel above. With few rows the row
// kernel leaves most SMs idle and each row's reads wait on one SM. Measured on an H200 (bench/RESULTS.md,
// sixteenth session, Mixtral-8x7B W4A8 decode, ms a step, rows / cluster): batch 1 (2 rows) 3.66 /
// 3.60, batch 32 (64 rows) 9.62 / 9.75.
ActivationKernel activation_kernel_for(const ActivationArgs& p) {
  static const ActivationKernel setting = [] {
    const std::string name = env_choice("NIBBLE_ACTIVATION", {"cluster", "rows"});
    return name == "cluster" ? ActivationKernel::kCluster : name == "rows" ? ActivationKernel::kRows
                                                                             : ActivationKernel::kAuto;
  }();
  const ActivationKernel chosen = p.kernel != ActivationKernel::kAuto ? p.kernel : setting;
  const bool rows_take_it = p.intermediate / 8 <= kActRowMaxUnits;
  if (chosen == ActivationKernel::kCluster || !rows_take_it) return ActivationKernel::kCluster;
  if (chosen == ActivationKernel::kRows) return ActivationKernel::kRows;
  return p.rows * kActCluster <= multiprocessor_count() ? ActivationKernel::kCluster : ActivationKernel::kRows;
}

}  // namespace

bool activation_takes_cluster_kernel(const ActivationArgs& p) {
  return activation_kernel_for(p) == ActivationKernel::kCluster;
}

void quantize_rows_fp8(const QuantizeRowsArgs& p, cudaStream_t stream) {
  check(p.cols > 0 && p.cols % (p.sums != nullptr ? kRowBlock : 16) == 0 && p.cols <= kMaxCols,
        "quantize_rows_fp8: ", p.cols, " columns");
  check(p.sorted_codes == nullptr || (p.row_pos != nullptr && p.top_k >= 1 && p.src_row == nullptr),
        "quantize_rows_fp8: routed copies need row_pos and top_k, and no gather");
  if (p.rows == 0) return;
  // Up to 256 threads (a multiple of 8 lanes: whole 64-blocks in a warp) holding 1 to 8 units each,
  // or 512 for rows longer than that.
  const int64_t units = p.cols / 8;
  const int threads = static_cast<int>(std::min<int64_t>(kQuantThreads, (units + 31) / 32 * 32));
  if (units > int64_t{threads} * kQuantMaxUnits) {
    const int64_t wide = (units + kQuantMaxUnits - 1) / kQuantMaxUnits;  // threads at 8 units each
    launch_kernel(wide_quantize_rows_kernel, static_cast<unsigned>(p.rows),
                  static_cast<int>(std::min<int64_t>(kQuantMaxThreads, (wide + 31) / 32 * 32)), 0, stream, p);
    return cuda_check(cudaGetLastError());
  }
  const int64_t per_thread = (units + threads - 1) / threads;
  if (per_thread <= 1)
    launch_quantize_rows<1>(p, threads, stream);
  else if (per_thread <= 2)
    launch_quantize_rows<2>(p, threads, stream);
  else if (per_thread <= 4)
    launch_quantize_rows<4>(p, threads, stream);
  else
    launch_quantize_rows<kQuantMaxUnits>(p, threads, stream);
  cuda_check(cudaGetLastError());
}

void activation_quantize_fp8(const ActivationArgs& p, cudaStream_t stream) {
  check(p.intermediate > 0 && p.intermediate % kRowBlock == 0 && p.intermediate <= kMaxCols,
        "activation_quantize_fp8: ", p.intermediate, " columns");
  if (p.rows == 0) return;
  // Calls with one K split take the kernels' kOneSplit variants unless NIBBLE_ACTIVATION_ONE_SPLIT=0.
  // Measured on an H200 (bench/RESULTS.md, twenty-third session, nibble-bench-moe, the prefill path,
  // µs without / with): Mixtral 4096 tokens 3729.1 / 3619.2, 32768 24020.4 / 23278.4.
  static const bool one_split_setting = env_choice("NIBBLE_ACTIVATION_ONE_SPLIT", {"0", "1"}) != "0";
  const bool bf16 = p.gate_up_bf16 != nullptr;
  check(!bf16 || p.splits == 1, "activation_quantize_fp8: a BF16 product has one split");
  check(!p.activated || (p.splits == 1 && !bf16 && p.row_scale == nullptr && !p.interleaved),
        "activation_quantize_fp8: an activated product is one F32 split, scaled, in order");
  check(p.part_amax == nullptr || (p.activated && p.amax_parts >= 1),
        "activation_quantize_fp8: the amax in parts comes with an activated product");
  const bool one_split = bf16 || ((p.one_split < 0 ? one_split_setting : p.one_split == 1) && p.splits == 1);
  // The kernel to launch: the one-split variant of p's activation (for p's product type), else the
  // general one; `variants` lists SiLU, GELU and GELU-tanh on F32 then on BF16, then the activated
  // product's.
  auto pick = [&](auto general, auto... variants) {
    using Kernel = decltype(general);
    const Kernel kernels[] = {variants...};
    if (p.activated) return kernels[6];
    if (!one_split) return general;
    const int act = p.activation == Activation::kSilu ? 0 : p.activation == Activation::kGelu ? 1 : 2;
    return kernels[(bf16 ? 3 : 0) + act];
  };
  constexpr int kSilu = static_cast<int>(Activation::kSilu), kGelu = static_cast<int>(Activation::kGelu),
                kGeluTanh = static_cast<int>(Activation::kGeluTanh);
  if (activation_kernel_for(p) == ActivationKernel::kRows) {
    const int64_t units = p.intermediate / 8;
    const int threads = static_cast<int>(std::min<int64_t>(kActRowThreads, (units + 31) / 32 * 32));
    const auto blocks = static_cast<unsigned>(p.rows);
    auto* kernel = units <= threads
                       ? pick(activation_rows_kernel<1, false, kRuntimeActivation>, activation_rows_kernel<1, true, kSilu>,
                              activation_rows_kernel<1, true, kGelu>, activation_rows_kernel<1, true, kGeluTanh>,
                              activation_rows_kernel<1, true, kSilu, true>, activation_rows_kernel<1, true, kGelu, true>,
                              activation_rows_kernel<1, true, kGeluTanh, true>, activation_rows_kernel<1, true, kActivated>)
                       : pick(activation_rows_kernel<2, false, kRuntimeActivation>, activation_rows_kernel<2, true, kSilu>,
                              activation_rows_kernel<2, true, kGelu>, activation_rows_kernel<2, true, kGeluTanh>,
                              activation_rows_kernel<2, true, kSilu, true>, activation_rows_kernel<2, true, kGelu, true>,
                              activation_rows_kernel<2, true, kGeluTanh, true>, activation_rows_kernel<2, true, kActivated>);
    launch_kernel(kernel, blocks, threads, 0, stream, p);
    return cuda_check(cudaGetLastError());
  }
  // A cluster of up to 8 blocks a row (fewer for a row of fewer 64-blocks).
  const auto cluster = static_cast<unsigned>(std::min<int64_t>(kActCluster, p.intermediate / kRowBlock));
  launch_kernel_with({cluster_shape(cluster)},
                     pick(activation_kernel<false, kRuntimeActivation>, activation_kernel<true, kSilu>,
                          activation_kernel<true, kGelu>, activation_kernel<true, kGeluTanh>,
                          activation_kernel<true, kSilu, true>, activation_kernel<true, kGelu, true>,
                          activation_kernel<true, kGeluTanh, true>, activation_kernel<true, kActivated>),
                     static_cast<unsigned>(p.rows) * cluster, kActThreads, 0, stream, p);
}

namespace {
std::atomic<int> g_tp_local_amax{-1};  // -1: not yet read from the environment
}  // namespace

bool tp_local_amax() {
  int local = g_tp_local_amax.load(std::memory_order_relaxed);
  if (local < 0) {
    const std::string name = env_choice("NIBBLE_TP_LOCAL_AMAX", {"0", "1"});
    int unread = -1;
    g_tp_local_amax.compare_exchange_strong(unread, name == "0" ? 0 : 1);
    local = g_tp_local_amax.load();
  }
  return local == 1;
}

void set_tp_local_amax(bool local) { g_tp_local_amax.store(local ? 1 : 0); }


void activation_quantize_fp8(const ActivationArgs& p, Communicator* communicator, Tensor& amax,
                             cudaStream_t stream) {
  if (communicator == nullptr || tp_local_amax()) return activation_quantize_fp8(p, stream);
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
