// Log-probabilities of a sampled token and of the most likely tokens, from the model's logits as they
// came out (before penalties, temperature, top-k and top-p: vLLM's default, "raw" log-probabilities).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace nibble {

// The most log-probabilities a request may ask for beside the sampled token's (vLLM's default limit).
inline constexpr int kMaxLogprobs = 20;

struct TokenLogprobs {
  float logprob = 0.0f;                          // the sampled token's
  std::vector<std::pair<int32_t, float>> top;    // the k most likely tokens, most likely first
};

// log softmax(logits)[token] and the k most likely tokens' (ties to the lower id; NaN logits last),
// the normalizer summed in double. A token of logit -inf has log-probability -inf.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int k);

}  // namespace nibble
