// Sampling penalties on the tokens a sequence has seen, as vLLM and SGLang apply them to the logits
// before temperature, top-k and top-p: a token of the prompt or the output has its logit divided by
// the repetition penalty where it is positive and multiplied by it where it is not; a token the
// sequence generated then loses frequency × (times generated) + presence. The host and the GPU compute
// a penalized logit alike (single roundings, no contraction), so both sample the same token.
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

// A token a sequence has seen, and how often it generated it (0: only in the prompt); kBanned: a token
// the sequence may not sample yet (a stop token before min_tokens), whose logit becomes -inf.
inline constexpr int32_t kBanned = -1;
struct SeenToken {
  int32_t token;
  int32_t generated;
  bool operator==(const SeenToken&) const = default;
};

NIBBLE_HOST_DEVICE inline float penalized_logit(float logit, int32_t generated, float repetition, float frequency,
                                                float presence) {
  using namespace sampling_detail;
  if (generated == kBanned) return -INFINITY;
  float x = logit > 0.0f ? div_rn(logit, repetition) : mul_rn(logit, repetition);
  if (generated > 0) x = sub_rn(sub_rn(x, mul_rn(frequency, static_cast<float>(generated))), presence);
  return x;
}

}  // namespace nibble
