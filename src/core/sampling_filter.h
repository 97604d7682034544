// Top-k and top-p (nucleus) filtering that the host and the GPU compute alike, so that a filtered
// draw gives the same token on both for a seed.
//
// A row's order: larger logits first, ties to the lower index (order_key: NaN last). Top-k keeps the
// first k of that order; top-p then keeps the shortest prefix of the kept tokens whose probability
// reaches top_p. The probabilities for top-p are integers (nucleus_weight: e^((logit − max) / T) in
// units of 2^-32, from a polynomial with explicit roundings, identical on both sides) and their sums
// are exact, so the prefix does not depend on the order in which a GPU adds them up; a token below
// 2^-32 of the most likely one weighs 0. The draw among the kept tokens is the Gumbel-max draw of
// counter_rng.h: the argmax of logit / T plus the token's Gumbel draw (ties to the lower index), a
// sample from softmax(logits / T) renormalized over the kept set.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/counter_rng.h"

namespace nibble {

namespace sampling_detail {
// Single IEEE roundings, never contracted into an FMA by either compiler.
#ifdef __CUDA_ARCH__
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
inline float add_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float sub_rn(float a, float b) {
  volatile float r = a - b;
  return r;
}
inline float mul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float div_rn(float a, float b) {
  volatile float r = a / b;
  return r;
}
inline float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
#endif
}  // namespace sampling_detail

#ifdef __CUDA_ARCH__
__device__ inline uint32_t float_bits(float value) { return __float_as_uint(value); }
__device__ inline float bits_float(uint32_t bits) { return __uint_as_float(bits); }
#else
inline uint32_t float_bits(float value) { return std::bit_cast<uint32_t>(value); }
inline float bits_float(uint32_t bits) { return std::bit_cast<float>(bits); }
#endif

// A row's order as an unsigned key: a larger key comes first. Monotone in the value (−0 just below
// +0), NaN lowest of all.
NIBBLE_HOST_DEVICE inline uint32_t order_key(float value) {
  if (value != value) return 0;
  const uint32_t bits = float_bits(value);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// The value order_key maps to `key` (NaN for 0).
NIBBLE_HOST_DEVICE inline float order_value(uint32_t key) {
  if (key == 0) return NAN;
  return bits_float((key & 0x80000000u) != 0 ? key & 0x7FFFFFFFu : ~key);
}

// A token's top-p weight: e^((logit − max_logit) / temperature) in units of 2^-32 of the most likely
// token's (which weighs 2^32), rounded down; 0 below 2^-32, for NaN and for −inf. 2^y (y ≤ 0) is
// 2^floor(y) times a degree-6 polynomial of the fraction: accurate to about 2e-5, which only moves
// the nucleus's edge by as much, and the same bits on the host and the GPU.
NIBBLE_HOST_DEVICE inline uint64_t nucleus_weight(float logit, float max_logit, float temperature) {
  using namespace sampling_detail;
  const float y = mul_rn(div_rn(sub_rn(logit, max_logit), temperature), 1.44269504f);  // log2(e)
  if (!(y >= -32.0f)) return 0;
  const float whole = floorf(y), f = sub_rn(y, whole);  // exact: f in [0, 1)
  float p = 1.54035304e-4f;                             // ln(2)^6 / 6!, then Horner down to 1
  p = fma_rn(p, f, 1.33335581e-3f);
  p = fma_rn(p, f, 9.61812911e-3f);
  p = fma_rn(p, f, 5.55041087e-2f);
  p = fma_rn(p, f, 2.40226507e-1f);
  p = fma_rn(p, f, 6.93147181e-1f);
  p = fma_rn(p, f, 1.0f);
  return static_cast<uint64_t>(ldexpf(p, static_cast<int>(whole) + 32));  // exact: a power-of-two scale
}

// The weight a top-p prefix must reach: ⌈top_p · total⌉ (total below 2^53: exact in double); 0 (no
// cut) for top_p ≥ 1.
NIBBLE_HOST_DEVICE inline uint64_t nucleus_target(float top_p, uint64_t total) {
  if (top_p >= 1.0f) return 0;
  return static_cast<uint64_t>(ceil(static_cast<double>(top_p) * static_cast<double>(total)));
}

// On the host: a draw from softmax(logits / temperature) over a row of n, filtered to its top_k
// tokens (0: no limit) and then to the top_p nucleus (1: no limit). Temperature > 0. Ties of the
// score go to the lower index; a kept set of −inf only gives its lowest index, of NaN only 0.
inline int32_t filtered_gumbel_argmax(const float* logits, int64_t n, float temperature, int64_t top_k, float top_p,
                                      uint64_t key) {
  if (top_k <= 0 && top_p >= 1.0f) return gumbel_argmax(logits, n, temperature, key);
  std::vector<int32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = top_k > 0 ? std::min(top_k, n) : n;
  const auto first = [&](int32_t a, int32_t b) {
    const uint32_t ka = order_key(logits[a]), kb = order_key(logits[b]);
    return ka > kb || (ka == kb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), first);
  int64_t keep = k;
  if (top_p < 1.0f) {
    const float max_logit = logits[order[0]];
    std::vector<uint64_t> weight(static_cast<std::size_t>(k));
    uint64_t total = 0;
    for (int64_t i = 0; i < k; ++i) total += weight[i] = nucleus_weight(logits[order[i]], max_logit, temperature);
    const uint64_t target = nucleus_target(top_p, total);
    uint64_t cumulative = 0;
    for (int64_t i = 0; i < k && target > 0; ++i)
      if ((cumulative += weight[i]) >= target) {
        keep = i + 1;
        break;
      }
  }
  int32_t best = INT32_MAX;
  double best_score = -INFINITY;
  for (int64_t i = 0; i < keep; ++i) {
    const int32_t token = order[i];
    const double score = gumbel_score(logits[token], temperature, key, token);
    if (score > best_score || (score == best_score && token < best)) best_score = score, best = token;
  }
  return best == INT32_MAX ? 0 : best;  // NaN only: 0, as gumbel_argmax
}

}  // namespace nibble
