// Next-token sampling on the host: greedy (temperature 0), or temperature with top-k and top-p
// (nucleus) filtering from a seeded generator, so a seed reproduces a generation exactly.
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

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

// The index of the largest value; ties go to the lowest index.
int32_t argmax(std::span<const float> values);

}  // namespace nibble
