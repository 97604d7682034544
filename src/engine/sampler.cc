// Greedy and filtered random sampling (the host's draw).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/counter_rng.h"
#include "core/error.h"
#include "core/sampling_filter.h"

namespace nibble {

void validate(const SamplingParams& p) {
  check(p.temperature >= 0.0f && std::isfinite(p.temperature), "temperature must be >= 0, got ",
        p.temperature);
  check(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got ", p.top_p);
  check(p.top_k >= 0, "top_k must be >= 0, got ", p.top_k);
  const Penalties& q = p.penalties;
  check(q.repetition > 0.0f && std::isfinite(q.repetition), "repetition_penalty must be > 0, got ", q.repetition);
  check(q.frequency >= -2.0f && q.frequency <= 2.0f, "frequency_penalty must be in [-2, 2], got ", q.frequency);
  check(q.presence >= -2.0f && q.presence <= 2.0f, "presence_penalty must be in [-2, 2], got ", q.presence);
  for (const auto& [token, bias] : p.logit_bias)
    check(token >= 0 && bias >= -100.0f && bias <= 100.0f, "logit_bias: token ", token, " bias ", bias,
          " (tokens >= 0, biases in [-100, 100])");
}

Sampler::Sampler(const SamplingParams& params) : params_(params) { validate(params); }

int32_t argmax(std::span<const float> values) {
  return static_cast<int32_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

uint64_t Sampler::next_key() { return splitmix64(params_.seed ^ splitmix64(draws_++)); }

int32_t Sampler::sample(std::span<const float> logits) {
  if (greedy()) return argmax(logits);
  return filtered_gumbel_argmax(logits.data(), static_cast<int64_t>(logits.size()), params_.temperature,
                                params_.top_k, params_.top_p, next_key());
}

}  // namespace nibble
