// The one-shot peer-to-peer all-reduce kernel (p2p_all_reduce.h) and its launch. Block b of every
// rank owns the same slice of the message: it copies its slice of x into its rank's staging half,
// flags block b of every peer, waits until every peer's block b flagged this epoch, then reduces
// the slice over the ranks' staging in rank order (sums in F32) and writes x.
//
// Epochs and buffer reuse. Each block keeps in device memory the epoch it last ran (all blocks of a
// rank run every call, so all hold the same value); call e runs epoch e (from 1), writes staging
// half e % 2 and flags `e`. Flags only grow, and a block waits for flag >= e (a fast peer may
// already have flagged e + 1). Why a rank r at call e may overwrite its half e % 2, which peers
// read at call e - 2: r's call e starts after its call e - 1 ended (one stream, kernels in order),
// and in call e - 1 r saw every peer p flag e - 1; p flagged e - 1 in its call e - 1, which started
// after p's call e - 2 ended, reads of r's half included. And r cannot run ahead to e + 1 while p
// still waits in e (r's call e needs p's flag e), so a flag >= e always means the half p reads
// holds epoch e's data. With one buffer instead of two, r at call e + 1 could overwrite what p
// still reads in call e. The slices may change from call to call (message size): the argument is
// about whole calls.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/p2p_all_reduce.h"
#include "cuda/ptx.cuh"
#include "cuda/row_norm.cuh"
#include "cuda/vec8.cuh"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 512;
// A waiting block gives up (traps: the device reports an error, never a hang) after this long; a
// peer that failed normally ends the wait at once through the abort flag. Longer than any skew
// between ranks that still make progress (the first calls may wait for a peer loading its kernels).
constexpr uint64_t kSpinTimeoutNs = 30'000'000'000ull;

__device__ inline uint64_t load_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ inline void store_release(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ inline uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline float to_float(float v) {
  return v;
}
__device__ inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) {
  return v;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The bits of one element, for the uncached peer loads.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 4, unsigned int, unsigned short>;

// kN consecutive elements: a pack of 16 bytes (kPack) in the bulk of a message, or one element in
// its tail. Slices are made of packs; the tail (numel % kPack elements) goes to the last block.
template <typename T>
constexpr int kPack = 16 / static_cast<int>(sizeof(T));

template <typename T, int kN>
struct alignas(sizeof(T) * kN) Vec {
  T e[kN];
};

// x's elements [i, i + kN): one vector access, or kN scalar ones where x is not 16-byte aligned.
template <typename T, int kN>
__device__ inline Vec<T, kN> load_x(const T* x, int64_t i, bool aligned) {
  if constexpr (kN > 1) {
    if (!aligned) {
      Vec<T, kN> v;
#pragma unroll
      for (int k = 0; k < kN; ++k) v.e[k] = x[i + k];
      return v;
    }
  }
  return *reinterpret_cast<const Vec<T, kN>*>(x + i);
}

template <typename T, int kN>
__device__ inline void store_x(T* x, int64_t i, bool aligned, const Vec<T, kN>& v) {
  if constexpr (kN > 1) {
    if (!aligned) {
#pragma unroll
      for (int k = 0; k < kN; ++k) x[i + k] = v.e[k];
      return;
    }
  }
  *reinterpret_cast<Vec<T, kN>*>(x + i) = v;
}

// A peer's staging (always aligned), bypassing the caches: fresh after the acquire of its flag.
template <typename T, int kN>
__device__ inline Vec<T, kN> load_peer(const T* staging, int64_t i) {
  using Raw = std::conditional_t<kN == 1, Bits<T>, uint4>;
  static_assert(sizeof(Raw) == sizeof(Vec<T, kN>));
  const Raw raw = __ldcv(reinterpret_cast<const Raw*>(staging + i));
  Vec<T, kN> v;
  memcpy(&v, &raw, sizeof raw);
  return v;
}

// Units [begin, end) of kN elements from `first` on: x into this rank's staging.
template <typename T, int kN>
__device__ inline void copy_in(const T* x, bool aligned, T* staging, int64_t first, int64_t begin,
                               int64_t end) {
  for (int64_t u = begin + threadIdx.x; u < end; u += kThreads) {
    const int64_t i = first + u * kN;
    *reinterpret_cast<Vec<T, kN>*>(staging + i) = load_x<T, kN>(x, i, aligned);
  }
}

// The same units: x = the sum (F32) or maximum over ranks in rank order, this rank's own values
// read from x.
template <typename T, P2pOp kOp, int kN>
__device__ inline void reduce_out(const P2pParams& p, std::size_t half_offset, int64_t first,
                                  int64_t begin, int64_t end) {
  T* x = static_cast<T*>(p.x);
  for (int64_t u = begin + threadIdx.x; u < end; u += kThreads) {
    const int64_t i = first + u * kN;
    Vec<T, kN> v[kP2pMaxRanks];
#pragma unroll
    for (int r = 0; r < kP2pMaxRanks; ++r)
      if (r < p.size)
        v[r] = r == p.rank
                   ? load_x<T, kN>(x, i, p.x_aligned)
                   : load_peer<T, kN>(reinterpret_cast<const T*>(p.staging[r] + half_offset), i);
    float acc[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) acc[k] = to_float(v[0].e[k]);  // not 0 + v: keeps the sign of -0
#pragma unroll
    for (int r = 1; r < kP2pMaxRanks; ++r)
      if (r < p.size)
#pragma unroll
        for (int k = 0; k < kN; ++k)
          acc[k] = kOp == P2pOp::kSum ? acc[k] + to_float(v[r].e[k])
                                      : fmaxf(acc[k], to_float(v[r].e[k]));
    Vec<T, kN> out;
#pragma unroll
    for (int k = 0; k < kN; ++k) out.e[k] = from_float<T>(acc[k]);
    store_x<T, kN>(x, i, p.x_aligned, out);
  }
}

// The start of a call, in every kernel of this file: after the grid dependency wait (PDL: the previous
// kernel's writes, x and the epochs included, are complete before any flag, staging or x access),
// *aborted cleared and the epoch this call runs (every thread reads it before the first barrier;
// thread 0 writes it back at the very end). The call writes staging half epoch % 2.
__device__ inline uint64_t start_call(const P2pParams& p, int* aborted) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (threadIdx.x == 0) *aborted = 0;
  return p.epochs[blockIdx.x] + 1;
}

// Flags block b of every peer with `epoch`, then waits until every peer's block b has flagged it, or
// the group aborted (then *aborted is 1). Every thread of the block calls it after writing its part of
// the staging; the barrier first orders those writes before the release stores (release is cumulative
// over what the storing thread has observed), so a peer that acquires the flag sees them.
__device__ inline void exchange_flags(const P2pParams& p, int b, uint64_t epoch, int* aborted) {
  __syncthreads();
  const int peer = static_cast<int>(threadIdx.x);
  if (peer < p.size && peer != p.rank) {
    store_release(p.flags[peer] + p.rank * kP2pMaxBlocks + b, epoch);
    const uint64_t* flag = p.flags[p.rank] + peer * kP2pMaxBlocks + b;
    uint64_t started = 0;
    for (uint32_t spins = 1; load_acquire(flag) < epoch; ++spins) {
      if (spins % 1024 != 0) continue;
      if (*p.abort_flag != 0) {
        *aborted = 1;
        break;
      }
      const uint64_t now = global_ns();
      if (started == 0) started = now;
      if (now - started > kSpinTimeoutNs) __trap();
    }
  }
  __syncthreads();
}

template <typename T, P2pOp kOp>
__global__ void __launch_bounds__(kThreads)
    p2p_all_reduce_kernel(const __grid_constant__ P2pParams p) {
  __shared__ int aborted;
  const int b = blockIdx.x;
  const uint64_t epoch = start_call(p, &aborted);
  const std::size_t half_offset = (epoch % 2) * kP2pMaxBytes;

  // This block's packs [begin, end) (the same on every rank); the last block also takes the tail.
  constexpr int kN = kPack<T>;
  const int64_t packs = p.numel / kN, tail_first = packs * kN, tail = p.numel - tail_first;
  const int64_t per_block = (packs + gridDim.x - 1) / gridDim.x;
  const int64_t begin = min(packs, b * per_block), end = min(packs, begin + per_block);
  const bool last = b == static_cast<int>(gridDim.x) - 1;

  const T* x = static_cast<const T*>(p.x);
  T* mine = reinterpret_cast<T*>(p.staging[p.rank] + half_offset);
  copy_in<T, kN>(x, p.x_aligned, mine, 0, begin, end);
  if (last) copy_in<T, 1>(x, p.x_aligned, mine, tail_first, 0, tail);
  exchange_flags(p, b, epoch, &aborted);
  if (aborted) return;

  reduce_out<T, kOp, kN>(p, half_offset, 0, begin, end);
  if (last) reduce_out<T, kOp, 1>(p, half_offset, tail_first, 0, tail);
  if (threadIdx.x == 0) p.epochs[b] = epoch;
}

// The F32 sum over ranks of y's row `row`, 8 columns from `col` on, in rank order as reduce_out adds
// (this rank's own values from y).
__device__ inline void sum8(const P2pParams& p, std::size_t half_offset, int64_t i, float (&s)[8]) {
  const float* y = static_cast<const float*>(p.x);
#pragma unroll
  for (int r = 0; r < kP2pMaxRanks; ++r) {
    if (r >= p.size) break;
    float v[8];
    if (r == p.rank) {
      load8(y + i, v);
    } else {
      const auto* peer = reinterpret_cast<const float*>(p.staging[r] + half_offset) + i;
      const Vec<float, 4> a = load_peer<float, 4>(peer, 0), c = load_peer<float, 4>(peer, 4);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = a.e[k], v[4 + k] = c.e[k];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) s[k] = r == 0 ? v[k] : s[k] + v[k];
  }
}

// The sum, then the residual add and RMSNorm (P2pAllReduce::reduce_add_rms_norm). Block b takes rows
// b, b + grid, ... on every rank: it stages them, exchanges flags like the plain kernel, then adds each
// row's sum (normalized first with the post-norm weights, when given, and rounded to BF16 as rms_norm's
// output is) into the residual and normalizes it with rms_norm_kernel's layout and arithmetic
// (basic_ops.cu: thread i holds units i, i + blockDim, ... of 8 columns, the block as wide as that
// kernel's), so the values equal the plain sum then the norms bit for bit.
template <int kUnits>
__global__ void __launch_bounds__(kThreads)
    p2p_all_reduce_add_rms_norm_kernel(const __grid_constant__ P2pParams p, const __grid_constant__ P2pNormArgs n) {
  __shared__ int aborted;
  __shared__ float warp_sums[kThreads / 32];
  const int b = blockIdx.x;
  const uint64_t epoch = start_call(p, &aborted);
  const std::size_t half_offset = (epoch % 2) * kP2pMaxBytes;
  const int64_t units = n.cols / 8;

  const float* y = static_cast<const float*>(p.x);
  float* mine = reinterpret_cast<float*>(p.staging[p.rank] + half_offset);
  for (int64_t row = b; row < n.rows; row += gridDim.x)
    for (int64_t u = threadIdx.x; u < 2 * units; u += blockDim.x)  // 16-byte halves of the units
      reinterpret_cast<float4*>(mine + row * n.cols)[u] = reinterpret_cast<const float4*>(y + row * n.cols)[u];
  exchange_flags(p, b, epoch, &aborted);
  if (aborted) return;

  const auto* weight = static_cast<const __nv_bfloat16*>(n.weight);
  const auto* post_weight = static_cast<const __nv_bfloat16*>(n.post_weight);
  for (int64_t row = b; row < n.rows; row += gridDim.x) {
    float* x = n.residual + row * n.cols;
    float add[kUnits][8];  // the row's sum over the ranks, post-normalized when asked
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (unit < units) sum8(p, half_offset, row * n.cols + unit * 8, add[u]);
    }
    if (post_weight != nullptr) {  // rms_norm(sum) · post_weight, rounded to BF16
      float squares = 0.0f;
#pragma unroll
      for (int u = 0; u < kUnits; ++u)
        if (u * static_cast<int64_t>(blockDim.x) + threadIdx.x < units) squares = add_squares(squares, add[u]);
      const float inv = inverse_rms(block_sum(squares, warp_sums), n.cols, n.eps);
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
        if (unit < units) scale_unit_bf16(add[u], inv, *reinterpret_cast<const uint4*>(post_weight + unit * 8));
      }
    }
    float v[kUnits][8];
    uint4 w_raw[kUnits] = {};
    float squares = 0.0f;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (unit < units) {
        load8(x + unit * 8, v[u]);
        w_raw[u] = *reinterpret_cast<const uint4*>(weight + unit * 8);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[u][j] += add[u][j];
        store8(x + unit * 8, v[u]);
        squares = add_squares(squares, v[u]);
      }
    }
    const float inv = inverse_rms(block_sum(squares, warp_sums), n.cols, n.eps);
    auto* out = static_cast<__nv_bfloat16*>(n.out) + row * n.cols;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (unit < units) {
        float w[8];
        scale_unit(v[u], inv, w_raw[u], w);
        store8(out + unit * 8, w);
      }
    }
  }
  if (threadIdx.x == 0) p.epochs[b] = epoch;
}

}  // namespace

void launch_p2p_all_reduce_add_rms_norm(const P2pParams& params, const P2pNormArgs& norm, int grid,
                                        cudaStream_t stream) {
  check(grid >= 1 && grid <= kP2pMaxBlocks && params.size >= 2 && params.size <= kP2pMaxRanks,
        "peer-to-peer all-reduce: grid ", grid, ", ", params.size, " ranks");
  // rms_norm's block (row_norm.cuh).
  check(norm.cols % 8 == 0, "peer-to-peer all-reduce + norm: ", norm.cols, " columns");
  const RowNormShape shape = row_norm_shape(norm.cols);
  check(shape.units_per_thread <= 4, "peer-to-peer all-reduce + norm: ", norm.cols, " columns");
  const int threads = shape.threads;
  if (shape.units_per_thread == 1)
    launch_kernel(p2p_all_reduce_add_rms_norm_kernel<1>, grid, threads, 0, stream, params, norm);
  else if (shape.units_per_thread == 2)
    launch_kernel(p2p_all_reduce_add_rms_norm_kernel<2>, grid, threads, 0, stream, params, norm);
  else
    launch_kernel(p2p_all_reduce_add_rms_norm_kernel<4>, grid, threads, 0, stream, params, norm);
  cuda_check(cudaGetLastError());
}

void launch_p2p_all_reduce(const P2pParams& params, P2pDType dtype, P2pOp op, int grid,
                           cudaStream_t stream) {
  check(grid >= 1 && grid <= kP2pMaxBlocks && params.size >= 2 && params.size <= kP2pMaxRanks,
        "peer-to-peer all-reduce: grid ", grid, ", ", params.size, " ranks");
  // The combinations that ship: sums of F32 (the residual stream) and BF16, maxima of F32 (the FP8
  // quantizers' row amax).
  if (op == P2pOp::kSum && dtype == P2pDType::kF32)
    launch_kernel(p2p_all_reduce_kernel<float, P2pOp::kSum>, grid, kThreads, 0, stream, params);
  else if (op == P2pOp::kSum && dtype == P2pDType::kBF16)
    launch_kernel(p2p_all_reduce_kernel<__nv_bfloat16, P2pOp::kSum>, grid, kThreads, 0, stream, params);
  else if (op == P2pOp::kMax && dtype == P2pDType::kF32)
    launch_kernel(p2p_all_reduce_kernel<float, P2pOp::kMax>, grid, kThreads, 0, stream, params);
  else
    fail("peer-to-peer all-reduce: no BF16 maximum");
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
