// Greedy and filtered random sampling.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/counter_rng.h"
#include "core/error.h"

namespace nibble {

void validate(const SamplingParams& p) {
  check(p.temperature >= 0.0f && std::isfinite(p.temperature), "temperature must be >= 0, got ",
        p.temperature);
  check(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got ", p.top_p);
  check(p.top_k >= 0, "top_k must be >= 0, got ", p.top_k);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { validate(params); }

int32_t argmax(std::span<const float> values) {
  return static_cast<int32_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

uint64_t Sampler::next_key() { return splitmix64(params_.seed ^ splitmix64(draws_++)); }

int32_t Sampler::sample(std::span<const float> logits) {
  if (greedy()) return argmax(logits);
  if (unfiltered())
    return gumbel_argmax(logits.data(), static_cast<int64_t>(logits.size()), params_.temperature, next_key());
  const auto n = static_cast<int64_t>(logits.size());
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  order.resize(k);
  std::vector<double> probs(k);
  const double top = logits[order[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += probs[i] = std::exp((logits[order[i]] - top) / params_.temperature);
  int64_t keep = k;
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      cumulative += probs[i] / sum;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double kept = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  for (int64_t i = 0; i < keep; ++i) {
    if (u < probs[i]) return order[i];
    u -= probs[i];
  }
  return order[keep - 1];
}

}  // namespace nibble
