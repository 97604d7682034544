// The one-shot peer-to-peer all-reduce kernel (p2p_all_reduce.h) and its launch. Block b of every
// rank owns the same slice of the message. Staged: it copies its slice of x into its rank's staging
// half, flags block b of every peer, waits until every peer's block b flagged this epoch, then reduces
// the slice over the ranks' staging in rank order (sums in F32) and writes x. Pushed: it stores its
// slice into every peer's inbox half, then waits for each peer's words of the slice in its own inbox
// to leave the empty pattern, reduces as the staged kernel does and writes the empty pattern back.
//
// Pushed messages. A word nobody has written holds kEmptyWord: per element, an F32 NaN or two BF16
// NaNs of one payload. A sender never sends it: elements with those bits go as the canonical quiet
// NaN of their type, on every rank alike (a rank reduces its own canonical values too, so all ranks
// keep equal bits; a NaN stays a NaN, and -0 keeps its sign: the sums of -0 are -0 as NCCL's). A reader takes an element once it is not empty (a 16-byte store may arrive in pieces: each
// element is checked). Why the two halves suffice: call e writes half e % 2, whose words each reader
// empties in call e after reading them; a sender writes that half again in call e + 2, after its call
// e + 1, which needed the reader's data (or flag) of call e + 1, sent after the reader's call e ended.
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

// x's elements [i, i + kN) = the sum (F32) or maximum of the ranks' v in rank order.
template <typename T, P2pOp kOp, int kN>
__device__ inline void store_reduced(const P2pParams& p, int64_t i, const Vec<T, kN> (&v)[kP2pMaxRanks]) {
  float acc[kN];
#pragma unroll
  for (int k = 0; k < kN; ++k) acc[k] = to_float(v[0].e[k]);  // not 0 + v: keeps the sign of -0
#pragma unroll
  for (int r = 1; r < kP2pMaxRanks; ++r)
    if (r < p.size)
#pragma unroll
      for (int k = 0; k < kN; ++k)
        acc[k] = kOp == P2pOp::kSum ? acc[k] + to_float(v[r].e[k]) : fmaxf(acc[k], to_float(v[r].e[k]));
  Vec<T, kN> out;
#pragma unroll
  for (int k = 0; k < kN; ++k) out.e[k] = from_float<T>(acc[k]);
  store_x<T, kN>(static_cast<T*>(p.x), i, p.x_aligned, out);
}

// The same units: x = the sum (F32) or maximum over ranks in rank order, this rank's own values
// read from x.
template <typename T, P2pOp kOp, int kN>
__device__ inline void reduce_out(const P2pParams& p, std::size_t half_offset, int64_t first,
                                  int64_t begin, int64_t end) {
  const T* x = static_cast<const T*>(p.x);
  for (int64_t u = begin + threadIdx.x; u < end; u += kThreads) {
    const int64_t i = first + u * kN;
    Vec<T, kN> v[kP2pMaxRanks];
#pragma unroll
    for (int r = 0; r < kP2pMaxRanks; ++r)
      if (r < p.size)
        v[r] = r == p.rank
                   ? load_x<T, kN>(x, i, p.x_aligned)
                   : load_peer<T, kN>(reinterpret_cast<const T*>(p.staging[r] + half_offset), i);
    store_reduced<T, kOp, kN>(p, i, v);
  }
}

// Pushed messages (the top of this file): kN elements' bits, a 16-byte pack or one element.
constexpr uint32_t kEmptyWord = 0x7FFF7FFFu;
template <typename T, int kN>
using Raw = std::conditional_t<kN == 1, Bits<T>, uint4>;

template <typename T>
__device__ inline uint32_t canonical_word(uint32_t w) {
  if constexpr (sizeof(T) == 4) {
    return w == kEmptyWord ? 0x7FC00000u : w;
  } else {  // two BF16
    if ((w & 0xFFFFu) == 0x7FFFu) w = (w & 0xFFFF0000u) | 0x7FC0u;
    if ((w >> 16) == 0x7FFFu) w = (w & 0xFFFFu) | 0x7FC00000u;
    return w;
  }
}
template <typename T>
__device__ inline bool filled_word(uint32_t w) {
  if constexpr (sizeof(T) == 4)
    return w != kEmptyWord;
  else
    return (w & 0xFFFFu) != 0x7FFFu && (w >> 16) != 0x7FFFu;
}
template <typename T, int kN>
__device__ inline Raw<T, kN> canonical(Raw<T, kN> r) {
  if constexpr (kN > 1) {
    return make_uint4(canonical_word<T>(r.x), canonical_word<T>(r.y), canonical_word<T>(r.z), canonical_word<T>(r.w));
  } else if constexpr (sizeof(T) == 4) {
    return canonical_word<T>(r);
  } else {
    return r == 0x7FFFu ? Bits<T>{0x7FC0u} : r;
  }
}
template <typename T, int kN>
__device__ inline bool filled(Raw<T, kN> r) {
  if constexpr (kN > 1)
    return filled_word<T>(r.x) && filled_word<T>(r.y) && filled_word<T>(r.z) && filled_word<T>(r.w);
  else if constexpr (sizeof(T) == 4)
    return filled_word<T>(r);
  else
    return r != 0x7FFFu;
}
template <typename T, int kN>
__device__ inline Raw<T, kN> empty_raw() {
  if constexpr (kN > 1)
    return make_uint4(kEmptyWord, kEmptyWord, kEmptyWord, kEmptyWord);
  else
    return static_cast<Bits<T>>(kEmptyWord);  // F32: the word; BF16: its low half
}
template <typename T, int kN>
__device__ inline Raw<T, kN> to_raw(const Vec<T, kN>& v) {
  Raw<T, kN> r;
  memcpy(&r, &v, sizeof r);
  return r;
}
template <typename T, int kN>
__device__ inline Vec<T, kN> to_vec(const Raw<T, kN>& r) {
  Vec<T, kN> v;
  memcpy(&v, &r, sizeof r);
  return v;
}
__device__ inline uint4 load_volatile(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ inline unsigned int load_volatile(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline unsigned short load_volatile(const unsigned short* p) {
  unsigned short v;
  asm volatile("ld.volatile.global.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return v;
}

// Element i of `sender`'s part of the inbox half of `epoch` in `inbox`.
template <typename T, int kN>
__device__ inline Raw<T, kN>* inbox_at(std::byte* inbox, uint64_t epoch, int sender, int64_t i) {
  const std::size_t part = ((epoch % 2) * kP2pMaxRanks + static_cast<std::size_t>(sender)) * kP2pPushMaxBytes;
  return reinterpret_cast<Raw<T, kN>*>(inbox + part + static_cast<std::size_t>(i) * sizeof(T));
}

// Elements [i, i + kN) of x, canonical, into every peer's inbox.
template <typename T, int kN>
__device__ inline Raw<T, kN> push_unit(const P2pParams& p, const T* x, bool aligned, uint64_t epoch, int64_t i) {
  const Raw<T, kN> raw = canonical<T, kN>(to_raw<T, kN>(load_x<T, kN>(x, i, aligned)));
#pragma unroll
  for (int r = 0; r < kP2pMaxRanks; ++r)
    if (r < p.size && r != p.rank) *inbox_at<T, kN>(p.inbox[r], epoch, p.rank, i) = raw;
  return raw;
}

// Units [begin, end) of kN elements from `first` on, pushed.
template <typename T, int kN>
__device__ inline void push_units(const P2pParams& p, uint64_t epoch, int64_t first, int64_t begin, int64_t end) {
  for (int64_t u = begin + threadIdx.x; u < end; u += kThreads)
    (void)push_unit<T, kN>(p, static_cast<const T*>(p.x), p.x_aligned, epoch, first + u * kN);
}

// `sender`'s elements [i, i + kN) from this rank's inbox once they arrived, their words emptied; on
// an abort of the group (*aborted then 1), whatever they hold.
template <typename T, int kN>
__device__ inline Vec<T, kN> await_unit(const P2pParams& p, uint64_t epoch, int sender, int64_t i,
                                        volatile int* aborted) {
  Raw<T, kN>* slot = inbox_at<T, kN>(p.inbox[p.rank], epoch, sender, i);
  Raw<T, kN> raw = load_volatile(slot);
  uint64_t started = 0;
  for (uint32_t spins = 1; !filled<T, kN>(raw); ++spins) {
    if (spins % 1024 == 0) {
      if (*aborted != 0 || *p.abort_flag != 0) {
        *aborted = 1;
        break;
      }
      const uint64_t now = global_ns();
      if (started == 0) started = now;
      if (now - started > kSpinTimeoutNs) __trap();
    }
    raw = load_volatile(slot);
  }
  *slot = empty_raw<T, kN>();
  return to_vec<T, kN>(raw);
}

// Pushed units [begin, end): x = the sum or maximum over ranks in rank order, this rank's own values
// read from x (canonical, as sent). Stops at an abort (x keeps this rank's values from there on).
template <typename T, P2pOp kOp, int kN>
__device__ inline void reduce_pushed(const P2pParams& p, uint64_t epoch, int64_t first, int64_t begin,
                                     int64_t end, volatile int* aborted) {
  const T* x = static_cast<const T*>(p.x);
  for (int64_t u = begin + threadIdx.x; u < end; u += kThreads) {
    const int64_t i = first + u * kN;
    Vec<T, kN> v[kP2pMaxRanks];
#pragma unroll
    for (int r = 0; r < kP2pMaxRanks; ++r)
      if (r < p.size)
        v[r] = r == p.rank ? to_vec<T, kN>(canonical<T, kN>(to_raw<T, kN>(load_x<T, kN>(x, i, p.x_aligned))))
                           : await_unit<T, kN>(p, epoch, r, i, aborted);
    if (*aborted != 0) return;
    store_reduced<T, kOp, kN>(p, i, v);
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

template <typename T, P2pOp kOp, bool kPush>
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

  if constexpr (kPush) {
    push_units<T, kN>(p, epoch, 0, begin, end);
    if (last) push_units<T, 1>(p, epoch, tail_first, 0, tail);
    __syncthreads();  // `aborted` cleared before any thread reads it
    reduce_pushed<T, kOp, kN>(p, epoch, 0, begin, end, &aborted);
    if (last) reduce_pushed<T, kOp, 1>(p, epoch, tail_first, 0, tail, &aborted);
    __syncthreads();  // every thread read the epoch before thread 0 writes it
    if (threadIdx.x == 0) p.epochs[b] = epoch;
    return;
  }
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

// The F32 sum over ranks of y's elements [i, i + 8), in rank order as reduce_out adds (this rank's own
// values from y; pushed, canonical as sent).
template <bool kPush>
__device__ inline void sum8(const P2pParams& p, uint64_t epoch, int64_t i, float (&s)[8], volatile int* aborted) {
  const float* y = static_cast<const float*>(p.x);
  const std::size_t half_offset = (epoch % 2) * kP2pMaxBytes;
#pragma unroll
  for (int r = 0; r < kP2pMaxRanks; ++r) {
    if (r >= p.size) break;
    float v[8];
    Vec<float, 4> a, c;
    if (r == p.rank) {
      a = load_x<float, 4>(y, i, true), c = load_x<float, 4>(y, i + 4, true);
      if constexpr (kPush)
        a = to_vec<float, 4>(canonical<float, 4>(to_raw<float, 4>(a))),
        c = to_vec<float, 4>(canonical<float, 4>(to_raw<float, 4>(c)));
    } else if constexpr (kPush) {
      a = await_unit<float, 4>(p, epoch, r, i, aborted), c = await_unit<float, 4>(p, epoch, r, i + 4, aborted);
    } else {
      const auto* peer = reinterpret_cast<const float*>(p.staging[r] + half_offset) + i;
      a = load_peer<float, 4>(peer, 0), c = load_peer<float, 4>(peer, 4);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = a.e[k], v[4 + k] = c.e[k];
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
template <int kUnits, bool kPush>
__global__ void __launch_bounds__(kThreads)
    p2p_all_reduce_add_rms_norm_kernel(const __grid_constant__ P2pParams p, const __grid_constant__ P2pNormArgs n) {
  __shared__ int aborted;
  __shared__ float warp_sums[kThreads / 32];
  const int b = blockIdx.x;
  const uint64_t epoch = start_call(p, &aborted);
  const int64_t units = n.cols / 8;

  const float* y = static_cast<const float*>(p.x);
  if constexpr (kPush) {
    for (int64_t row = b; row < n.rows; row += gridDim.x)
      for (int64_t u = threadIdx.x; u < 2 * units; u += blockDim.x)  // 16-byte halves of the units
        (void)push_unit<float, 4>(p, y, true, epoch, row * n.cols + 4 * u);
    __syncthreads();  // `aborted` cleared before any thread reads it
  } else {
    float* mine = reinterpret_cast<float*>(p.staging[p.rank] + (epoch % 2) * kP2pMaxBytes);
    for (int64_t row = b; row < n.rows; row += gridDim.x)
      for (int64_t u = threadIdx.x; u < 2 * units; u += blockDim.x)  // 16-byte halves of the units
        reinterpret_cast<float4*>(mine + row * n.cols)[u] = reinterpret_cast<const float4*>(y + row * n.cols)[u];
    exchange_flags(p, b, epoch, &aborted);
    if (aborted) return;
  }

  const auto* weight = static_cast<const __nv_bfloat16*>(n.weight);
  const auto* post_weight = static_cast<const __nv_bfloat16*>(n.post_weight);
  for (int64_t row = b; row < n.rows; row += gridDim.x) {
    float* x = n.residual + row * n.cols;
    float add[kUnits][8];  // the row's sum over the ranks, post-normalized when asked
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int64_t unit = u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (unit < units) sum8<kPush>(p, epoch, row * n.cols + unit * 8, add[u], &aborted);
    }
    if constexpr (kPush) {
      __syncthreads();  // the whole block leaves together on an abort
      if (aborted) return;
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
  if constexpr (kPush) __syncthreads();  // every thread read the epoch before thread 0 writes it
  if (threadIdx.x == 0) p.epochs[b] = epoch;
}

__global__ void fill_inbox_kernel(uint32_t* words, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    words[i] = kEmptyWord;
}

}  // namespace

cudaError_t fill_p2p_inbox(void* inbox, std::size_t words, cudaStream_t stream) {
  fill_inbox_kernel<<<256, 256, 0, stream>>>(static_cast<uint32_t*>(inbox), words);
  return cudaGetLastError();
}

void launch_p2p_all_reduce_add_rms_norm(const P2pParams& params, const P2pNormArgs& norm, int grid,
                                        cudaStream_t stream) {
  check(grid >= 1 && grid <= kP2pMaxBlocks && params.size >= 2 && params.size <= kP2pMaxRanks,
        "peer-to-peer all-reduce: grid ", grid, ", ", params.size, " ranks");
  // rms_norm's block (row_norm.cuh).
  check(norm.cols % 8 == 0, "peer-to-peer all-reduce + norm: ", norm.cols, " columns");
  const RowNormShape shape = row_norm_shape(norm.cols);
  check(shape.units_per_thread <= 4, "peer-to-peer all-reduce + norm: ", norm.cols, " columns");
  const int threads = shape.threads;
  const auto launch = [&](auto kernel) { launch_kernel(kernel, grid, threads, 0, stream, params, norm); };
  if (shape.units_per_thread == 1)
    params.push ? launch(p2p_all_reduce_add_rms_norm_kernel<1, true>) : launch(p2p_all_reduce_add_rms_norm_kernel<1, false>);
  else if (shape.units_per_thread == 2)
    params.push ? launch(p2p_all_reduce_add_rms_norm_kernel<2, true>) : launch(p2p_all_reduce_add_rms_norm_kernel<2, false>);
  else
    params.push ? launch(p2p_all_reduce_add_rms_norm_kernel<4, true>) : launch(p2p_all_reduce_add_rms_norm_kernel<4, false>);
  cuda_check(cudaGetLastError());
}

void launch_p2p_all_reduce(const P2pParams& params, P2pDType dtype, P2pOp op, int grid,
                           cudaStream_t stream) {
  check(grid >= 1 && grid <= kP2pMaxBlocks && params.size >= 2 && params.size <= kP2pMaxRanks,
        "peer-to-peer all-reduce: grid ", grid, ", ", params.size, " ranks");
  // The combinations that ship: sums of F32 (the residual stream) and BF16, maxima of F32 (the FP8
  // quantizers' row amax).
  const auto launch = [&](auto kernel) { launch_kernel(kernel, grid, kThreads, 0, stream, params); };
  if (op == P2pOp::kSum && dtype == P2pDType::kF32)
    params.push ? launch(p2p_all_reduce_kernel<float, P2pOp::kSum, true>)
                : launch(p2p_all_reduce_kernel<float, P2pOp::kSum, false>);
  else if (op == P2pOp::kSum && dtype == P2pDType::kBF16)
    params.push ? launch(p2p_all_reduce_kernel<__nv_bfloat16, P2pOp::kSum, true>)
                : launch(p2p_all_reduce_kernel<__nv_bfloat16, P2pOp::kSum, false>);
  else if (op == P2pOp::kMax && dtype == P2pDType::kF32)
    params.push ? launch(p2p_all_reduce_kernel<float, P2pOp::kMax, true>)
                : launch(p2p_all_reduce_kernel<float, P2pOp::kMax, false>);
  else
    fail("peer-to-peer all-reduce: no BF16 maximum");
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
