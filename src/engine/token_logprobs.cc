// Log-softmax at a few tokens and the top k of a row.
#include "engine/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/sampling_filter.h"

namespace nibble {

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int k) {
  const auto V = static_cast<int64_t>(logits.size());
  check(token >= 0 && token < V, "token_logprobs: token ", token, " outside the vocabulary of ", V);
  check(k >= 0, "token_logprobs: k = ", k);
  float max = -std::numeric_limits<float>::infinity();
  for (float x : logits)
    if (x > max) max = x;
  double sum = 0.0;
  for (float x : logits)
    if (x == x) sum += std::exp(static_cast<double>(x) - max);
  const double log_z = static_cast<double>(max) + std::log(sum);
  auto logprob = [&](int32_t t) { return static_cast<float>(static_cast<double>(logits[t]) - log_z); };
  TokenLogprobs out{.logprob = logprob(token), .top = {}};
  const auto n = static_cast<std::size_t>(std::min<int64_t>(k, V));
  std::vector<int32_t> ids(static_cast<std::size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(), [&](int32_t a, int32_t b) {
    const uint32_t ka = order_key(logits[a]), kb = order_key(logits[b]);
    return ka != kb ? ka > kb : a < b;
  });
  for (std::size_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], logprob(ids[i]));
  return out;
}

}  // namespace nibble
