// Filtered row sampling (sampling.h): the host's filtered_gumbel_argmax (core/sampling_filter.h) without
// sorting. Top-k and top-p each keep a prefix of the row's order (larger order_key first, ties to the
// lower index), so a kept set is a cut: the last kept token's key and index. Radix selects find the cuts,
// 8 bits of the key a pass: a block-wide histogram over the tokens whose key matches the bits found so
// far, counting them for top-k and summing their integer nucleus weights for top-p (exact, so the order
// of the additions does not matter); among the tokens of the cut's key the kept ones are the lowest
// indices. The draw is then the Gumbel-max argmax over the kept tokens, as sampling.cu's for a whole row.
#include <climits>
#include <cmath>
#include <cstdint>

#include "core/counter_rng.h"
#include "core/sampling_filter.h"
#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"
#include "cuda/sampling.h"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;
constexpr unsigned kAll = 0xFFFFFFFFu;
using u64 = unsigned long long;  // what atomicAdd and the shuffles take

// The end of a kept prefix: every token of a larger key, and those of this key up to this index.
struct Cut {
  uint32_t key;
  int64_t index;
};
constexpr Cut kWholeRow{0, INT64_MAX};  // NaN's key is 0, the lowest

__device__ inline bool kept(uint32_t key, int64_t index, Cut cut) {
  return key > cut.key || (key == cut.key && index <= cut.index);
}

struct Best {
  double score;
  int index;
};

__device__ inline Best better(Best a, Best b) {
  return b.score > a.score || (b.score == a.score && b.index < a.index) ? b : a;
}

__device__ inline u64 shuffle_xor(u64 v, int offset) { return __shfl_xor_sync(kAll, v, offset); }
__device__ inline Best shuffle_xor(Best b, int offset) {
  return {__shfl_xor_sync(kAll, b.score, offset), __shfl_xor_sync(kAll, b.index, offset)};
}

struct Shared {
  // A radix pass's histogram: each bin's sum as a low word and the carries out of it (add_to_bin).
  uint32_t low[256], high[256];
  u64 partial[kWarps];  // per warp: reductions, counts
  Best best[kWarps];
  // What one thread found, for all.
  int digit;
  u64 remaining;
  bool found;
  int64_t index;
};

// `v` combined by `op` over the block, for every thread; `partial` is reusable on return.
template <typename T, typename Op>
__device__ T block_reduce(T v, T identity, Op op, T* partial) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) v = op(v, shuffle_xor(v, o));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < kWarps ? partial[lane] : identity;
  for (int o = 16; o > 0; o /= 2) v = op(v, shuffle_xor(v, o));
  __syncthreads();
  return v;
}

// Adds `amount` to a bin with 32-bit shared atomics (native, where 64-bit ones are a compare-and-swap
// loop): the addition that wraps the low word carries one into the high word, so the sum is exact.
__device__ inline void add_to_bin(Shared& s, int bin, u64 amount) {
  const auto low = static_cast<uint32_t>(amount);
  auto carry = static_cast<uint32_t>(amount >> 32);
  if (low != 0 && atomicAdd(&s.low[bin], low) > UINT32_MAX - low) ++carry;
  if (carry != 0) atomicAdd(&s.high[bin], carry);
}

struct Select {
  uint32_t key;
  u64 remaining;  // of the target, for this key's tokens (≥ 1)
  bool found;
};

// Radix select: the key at which a running total in row order over the tokens `within` keeps (each
// adding amount_of its logit) first reaches `target` (≥ 1), and what remains of the target for that
// key's tokens after the larger keys'; found false where the whole total falls short.
template <typename AmountOf>
__device__ Select radix_select(const float* row, int64_t V, Cut within, u64 target, AmountOf amount_of, Shared& s) {
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, mask = 0;
  u64 remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (threadIdx.x < 256) s.low[threadIdx.x] = s.high[threadIdx.x] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float x = row[i];
      const uint32_t key = order_key(x);
      if ((key & mask) != prefix || !kept(key, i, within)) continue;
      const u64 amount = amount_of(x);
      if (amount != 0) add_to_bin(s, static_cast<int>((key >> shift) & 0xFFu), amount);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l sums digits 255 − 8l down to 248 − 8l, so that a scan over the lanes goes in row order.
      const auto bin = [&](int digit) { return (static_cast<u64>(s.high[digit]) << 32) + s.low[digit]; };
      u64 sum = 0;
      for (int j = 0; j < 8; ++j) sum += bin(255 - 8 * lane - j);
      u64 inclusive = sum;
      for (int o = 1; o < 32; o *= 2) {
        const u64 below = __shfl_up_sync(kAll, inclusive, o);
        if (lane >= o) inclusive += below;
      }
      u64 before = inclusive - sum;
      const bool here = before < remaining && inclusive >= remaining;
      if (here) {
        int digit = 255 - 8 * lane;
        while (before + bin(digit) < remaining) before += bin(digit--);
        s.digit = digit;
        s.remaining = remaining - before;
      }
      const bool found = __ballot_sync(kAll, here) != 0;
      if (lane == 0) s.found = found;
    }
    __syncthreads();
    if (!s.found) return {0, 0, false};
    prefix |= static_cast<uint32_t>(s.digit) << shift;
    mask |= 0xFFu << shift;
    remaining = s.remaining;
  }
  return {prefix, remaining, true};
}

// The index of the n-th token (n ≥ 1, in index order) whose order_key is `key`; the row has at least n.
// Warp w looks through its own stretch of the row, 32 tokens at a time: once to count, and the warp
// whose stretch holds the n-th again to find it.
__device__ int64_t nth_of_key(const float* row, int64_t V, uint32_t key, u64 n, Shared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t stretch = (V + kThreads - 1) / kThreads * 32;
  const int64_t begin = warp * stretch, end = begin + stretch < V ? begin + stretch : V;
  const auto hits = [&](int64_t i) { return __ballot_sync(kAll, i + lane < end && order_key(row[i + lane]) == key); };
  u64 count = 0;
  for (int64_t i = begin; i < end; i += 32) count += __popc(hits(i));
  if (lane == 0) s.partial[warp] = count;
  __syncthreads();
  u64 before = lane < warp ? s.partial[lane] : 0;
  for (int o = 16; o > 0; o /= 2) before += shuffle_xor(before, o);
  if (before < n && n <= before + count) {
    for (int64_t i = begin; i < end; i += 32) {
      uint32_t found = hits(i);
      const auto here = static_cast<u64>(__popc(found));
      if (before + here >= n) {
        for (u64 j = n - before; j > 1; --j) found &= found - 1;  // drop the hits before the n-th
        if (lane == 0) s.index = i + __ffs(found) - 1;
        break;
      }
      before += here;
    }
  }
  __syncthreads();
  return s.index;
}

// Top-p over the tokens `cut` keeps (core/sampling_filter.h): the cut of the shortest prefix whose weight
// reaches nucleus_target, or `cut` itself where the target is 0 or never reached (the host's loop).
__device__ Cut nucleus_cut(const float* row, int64_t V, float temperature, float top_p, Cut cut, Shared& s) {
  u64 top = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) top = max(top, static_cast<u64>(order_key(row[i])));
  top = block_reduce(top, 0ull, [](u64 a, u64 b) { return max(a, b); }, s.partial);
  // The host's logits[order[0]]: the same bits, or a NaN where the row is NaN only (every weight is 0).
  const float max_logit = order_value(static_cast<uint32_t>(top));
  const auto weight = [=](float x) -> u64 { return nucleus_weight(x, max_logit, temperature); };
  u64 total = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads)
    if (kept(order_key(row[i]), i, cut)) total += weight(row[i]);
  total = block_reduce(total, 0ull, [](u64 a, u64 b) { return a + b; }, s.partial);
  const u64 target = nucleus_target(top_p, total);
  if (target == 0) return cut;
  const Select edge = radix_select(row, V, cut, target, weight, s);
  if (!edge.found) return cut;
  // Tokens of one key have one logit, so one weight (≥ 1 here): the prefix takes as many of them as
  // reach the rest of the target, the lowest indices first; all of them are within `cut`.
  const u64 w = weight(order_value(edge.key));
  return {edge.key, nth_of_key(row, V, edge.key, (edge.remaining + w - 1) / w, s)};
}

__global__ void __launch_bounds__(kThreads)
    filtered_sample_kernel(const float* logits, const float* temperatures, const int64_t* keys, const int32_t* top_ks,
                           const float* top_ps, int64_t V, int32_t* out) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  __shared__ Shared s;
  const float* row = logits + blockIdx.x * V;
  const float t = temperatures[blockIdx.x];
  const int64_t top_k = top_ks != nullptr ? top_ks[blockIdx.x] : 0;
  const float top_p = top_ps != nullptr ? top_ps[blockIdx.x] : 1.0f;
  // As Ops::sample and filtered_gumbel_argmax: a greedy row ignores the filters, and a row without any
  // is gumbel_argmax's.
  const bool filtered = t != 0.0f && !(top_k <= 0 && top_p >= 1.0f);
  Cut cut = kWholeRow;
  if (filtered && top_k > 0 && top_k < V) {  // the k-th token in order ends the prefix
    const Select kth = radix_select(row, V, kWholeRow, static_cast<u64>(top_k), [](float) { return 1ull; }, s);
    cut = {kth.key, nth_of_key(row, V, kth.key, kth.remaining, s)};
  }
  if (filtered && top_p < 1.0f) cut = nucleus_cut(row, V, t, top_p, cut, s);

  const auto key = static_cast<uint64_t>(keys[blockIdx.x]);
  Best best{-INFINITY, INT_MAX};
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float x = row[i];
    if (!kept(order_key(x), i, cut)) continue;
    const double score = t == 0.0f ? static_cast<double>(x) : gumbel_score(x, t, key, i);
    // NaN never wins; -inf only among a filtered row's kept tokens (its lowest index), as on the host.
    if (filtered || score > -INFINITY) best = better(best, {score, static_cast<int>(i)});
  }
  best = block_reduce(best, Best{-INFINITY, INT_MAX}, [](Best a, Best b) { return better(a, b); }, s.best);
  // Nothing found: 0, and so for a greedy row that starts with NaN (std::max_element).
  if (threadIdx.x == 0) out[blockIdx.x] = best.index == INT_MAX || (t == 0.0f && row[0] != row[0]) ? 0 : best.index;
}

}  // namespace

void sample_filtered_rows(const Tensor& logits, const Tensor& temperatures, const Tensor& keys, const Tensor* top_k,
                          const Tensor* top_p, Tensor& out, cudaStream_t stream) {
  expect(logits, DType::kF32, {-1, -1}, "sample logits");
  const int64_t R = logits.dim(0), V = logits.dim(1);
  expect(temperatures, DType::kF32, {R}, "sample temperatures");
  expect(keys, DType::kI64, {R}, "sample keys");
  if (top_k != nullptr) expect(*top_k, DType::kI32, {R}, "sample top_k");
  if (top_p != nullptr) expect(*top_p, DType::kF32, {R}, "sample top_p");
  expect(out, DType::kI32, {R}, "sample output");
  check(V >= 1 && V < INT_MAX, "sample: ", V, " values a row");
  if (R == 0) return;
  launch_kernel(filtered_sample_kernel, static_cast<unsigned>(R), kThreads, 0, stream, logits.data<float>(),
                temperatures.data<float>(), keys.data<int64_t>(), top_k != nullptr ? top_k->data<int32_t>() : nullptr,
                top_p != nullptr ? top_p->data<float>() : nullptr, V, out.data<int32_t>());
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
