// Next-token sampling: greedy (temperature 0 or top-k 1), else the Gumbel-max draw (the argmax of
// logit / T plus Gumbel noise keyed by the seed and the draw's number: counter_rng.h) among the tokens
// that top-k and top-p (nucleus) filtering keep (sampling_filter.h). The backends run it where the
// logits are (Ops::sample) and give the same token as sample() here for the same key. A seed
// reproduces a generation exactly.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/logit_penalties.h"

namespace nibble {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // keep the smallest set of tokens whose probability reaches top_p
  int64_t top_k = 0;         // 0: no limit
  uint64_t seed = 0;
  Penalties penalties = {};  // on the tokens the sequence has seen, before the above (logit_penalties.h)
  std::vector<std::pair<int32_t, float>> logit_bias;  // distinct tokens' biases in [-100, 100], added first
};

// Fails with a clear message for out-of-range values.
void validate(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);
  // Whether sample() is the argmax (temperature 0 or top_k 1): the runner then takes it on the device.
  bool greedy() const { return params_.temperature == 0.0f || params_.top_k == 1; }
  float temperature() const { return params_.temperature; }
  int64_t top_k() const { return params_.top_k; }
  float top_p() const { return params_.top_p; }
  // The key of this sequence's next draw (each call is one draw; sample() takes one too).
  uint64_t next_key();

 private:
  SamplingParams params_;
  uint64_t draws_ = 0;
};

// The index of the largest value; ties go to the lowest index.
int32_t argmax(std::span<const float> values);

}  // namespace nibble
