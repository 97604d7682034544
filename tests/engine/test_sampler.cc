// Sampling: temperature alone draws by the Gumbel-max trick (core/counter_rng.h) from softmax(logits /
// T), checked against that distribution; a seed reproduces the draws; Ops::sample (the runner's path,
// here the host default) gives exactly Sampler::sample's tokens for the same keys.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/counter_rng.h"
#include "cpu/cpu_ops.h"
#include "engine/sampler.h"

namespace nibble {
namespace {

TEST(Sampler, TemperatureAloneDrawsFromTheSoftmax) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 3.0f, 0.0f, -INFINITY};
  for (const float t : {0.5f, 1.0f, 2.0f}) {
    Sampler sampler({.temperature = t, .top_p = 1.0f, .top_k = 0, .seed = 11});
    ASSERT_TRUE(sampler.unfiltered());
    constexpr int kDraws = 200000;
    std::vector<int> counts(logits.size());
    for (int i = 0; i < kDraws; ++i) ++counts.at(static_cast<std::size_t>(sampler.sample(logits)));
    double sum = 0;
    std::vector<double> p(logits.size());
    for (std::size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(double{logits[i]} / t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] /= sum;
      const double f = static_cast<double>(counts[i]) / kDraws, sigma = std::sqrt(p[i] * (1 - p[i]) / kDraws);
      EXPECT_NEAR(f, p[i], 5 * sigma + 1e-9) << "temperature " << t << " token " << i;
    }
    EXPECT_EQ(counts.back(), 0);  // −inf is never drawn
  }
}

TEST(Sampler, SeedReproducesDraws) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> logits(1000);
  for (float& v : logits) v = normal(rng);
  auto draws = [&](uint64_t seed) {
    Sampler sampler({.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sampler.sample(logits));
    return out;
  };
  EXPECT_EQ(draws(5), draws(5));
  EXPECT_NE(draws(5), draws(6));
  // A tiny temperature is the argmax.
  Sampler cold({.temperature = 1e-4f, .top_p = 1.0f, .top_k = 0, .seed = 1});
  EXPECT_EQ(cold.sample(logits), argmax(logits));
}

TEST(Sampler, OpsSampleEqualsSamplerSample) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  const int64_t rows = 4, vocab = 5000;
  const std::vector<SamplingParams> params = {{.temperature = 0.0f},
                                              {.temperature = 0.7f, .seed = 1},
                                              {.temperature = 1.3f, .seed = 2},
                                              {.temperature = 1.0f, .top_k = 1, .seed = 3}};  // greedy
  std::vector<Sampler> host, device;
  for (const SamplingParams& p : params) host.emplace_back(p), device.emplace_back(p);
  CpuOps ops;
  for (int step = 0; step < 20; ++step) {
    Tensor logits = Tensor::zeros(DType::kF32, {rows, vocab});
    for (int64_t i = 0; i < rows * vocab; ++i) logits.data<float>()[i] = 3 * normal(rng);
    Tensor temperatures = Tensor::zeros(DType::kF32, {rows}), keys = Tensor::zeros(DType::kI64, {rows});
    for (int64_t r = 0; r < rows; ++r)
      if (!device[r].greedy()) {
        temperatures.data<float>()[r] = device[r].temperature();
        keys.data<int64_t>()[r] = static_cast<int64_t>(device[r].next_key());
      }
    Tensor ids = Tensor::zeros(DType::kI32, {rows});
    ops.sample(logits, temperatures, keys, ids);
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(ids.data<int32_t>()[r],
                host[r].sample({logits.data<float>() + r * vocab, static_cast<std::size_t>(vocab)}))
          << "step " << step << " row " << r;
  }
}

}  // namespace
}  // namespace nibble
