// Next-token sampling: greedy (temperature 0); temperature alone by the Gumbel-max trick (the argmax
// of logit / T plus Gumbel noise keyed by the seed and the draw's number: counter_rng.h), which the
// backends can run where the logits are (Ops::sample); or temperature with top-k and top-p (nucleus)
// filtering on the host from a seeded generator. A seed reproduces a generation exactly.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace nibble {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // keep the smallest set of tokens whose probability reaches top_p
  int64_t top_k = 0;         // 0: no limit
  uint64_t seed = 0;
};

// Fails with a clear message for out-of-range values.
void validate(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);
  // Whether sample() is the argmax (temperature 0 or top_k 1): the runner then takes it on the device.
  bool greedy() const { return params_.temperature == 0.0f || params_.top_k == 1; }
  // Whether sample() is temperature alone (no top-k, no top-p): the Gumbel-max draw, which the runner
  // may take on the device with the key next_key() gives and temperature().
  bool unfiltered() const { return !greedy() && params_.top_k == 0 && params_.top_p >= 1.0f; }
  float temperature() const { return params_.temperature; }
  // The key of this sequence's next Gumbel-max draw (each call is one draw).
  uint64_t next_key();

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;
};

// The index of the largest value; ties go to the lowest index.
int32_t argmax(std::span<const float> values);

}  // namespace nibble
