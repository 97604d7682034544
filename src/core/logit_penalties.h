// Logit adjustments on the tokens a sequence names or has seen, in vLLM's order, before temperature,
// top-k and top-p: a token's logit_bias is added; a stop token before min_tokens becomes -inf; a token
// of the prompt or the output then has its logit divided by the repetition penalty where it is
// positive and multiplied by it where it is not; a token the sequence generated loses frequency ×
// (times generated) + presence. The host and the GPU compute an adjusted logit alike (single
// roundings, no contraction), so both sample the same token.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/sampling_filter.h"

namespace nibble {

struct Penalties {
  float repetition = 1.0f;  // > 0; 1: none
  float frequency = 0.0f;   // OpenAI's range [-2, 2]; 0: none
  float presence = 0.0f;    // [-2, 2]; 0: none
  bool any() const { return repetition != 1.0f || frequency != 0.0f || presence != 0.0f; }
};

// A token whose logit a sequence adjusts: how often the sequence generated it (0: only in the prompt or
// only biased; kNotSeen: neither in the prompt nor generated, only biased; kBanned: it may not be
// sampled yet, a stop token before min_tokens) and its logit_bias.
inline constexpr int32_t kBanned = -1;
inline constexpr int32_t kNotSeen = -2;
struct SeenToken {
  int32_t token;
  int32_t generated;
  float bias = 0.0f;
  bool operator==(const SeenToken&) const = default;
};

NIBBLE_HOST_DEVICE inline float penalized_logit(float logit, int32_t generated, float bias, float repetition,
                                                float frequency, float presence) {
  using namespace sampling_detail;
  if (generated == kBanned) return -INFINITY;
  float x = bias != 0.0f ? add_rn(logit, bias) : logit;
  if (generated == kNotSeen) return x;
  x = x > 0.0f ? div_rn(x, repetition) : mul_rn(x, repetition);
  if (generated > 0) x = sub_rn(sub_rn(x, mul_rn(frequency, static_cast<float>(generated))), presence);
  return x;
}

}  // namespace nibble
