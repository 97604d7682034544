// Sampling: temperature alone draws by the Gumbel-max trick (core/counter_rng.h) from softmax(logits /
// T), and with top-k and top-p from that softmax renormalized over the kept tokens (the kept sets and
// their distributions derived here in double, independently of core/sampling_filter.h's integer
// weights); a seed reproduces the draws; Ops::sample (the runner's path, here the host default) gives
// exactly Sampler::sample's tokens for the same keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/counter_rng.h"
#include "core/sampling_filter.h"
#include "cpu/cpu_ops.h"
#include "engine/sampler.h"

namespace nibble {
namespace {

TEST(Sampler, TemperatureAloneDrawsFromTheSoftmax) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 3.0f, 0.0f, -INFINITY};
  for (const float t : {0.5f, 1.0f, 2.0f}) {
    Sampler sampler({.temperature = t, .top_p = 1.0f, .top_k = 0, .seed = 11});
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

// The kept set of a row by the definition (sort by value, ties to the lower index; the first top_k;
// then the shortest prefix whose softmax probability in double reaches top_p) and the draw's
// distribution over it.
std::vector<double> filtered_softmax(const std::vector<float>& logits, float t, int64_t top_k, float top_p) {
  const auto n = static_cast<int64_t>(logits.size());
  std::vector<int64_t> order(logits.size());
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  const int64_t k = top_k > 0 ? std::min(top_k, n) : n;
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += std::exp((double{logits[order[i]]} - logits[order[0]]) / t);
  int64_t keep = k;
  double cumulative = 0;
  for (int64_t i = 0; i < k && top_p < 1.0f; ++i) {
    cumulative += std::exp((double{logits[order[i]]} - logits[order[0]]) / t) / sum;
    if (cumulative >= top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[order[i]] = std::exp((double{logits[order[i]]} - logits[order[0]]) / t);
  for (double& v : p) v /= kept;
  return p;
}

TEST(Sampler, FilteredDrawsFromTheRenormalizedSoftmax) {
  // Softmax at T 1: 0.6439, 0.0871, 0.2369, 0.0321 (the cumulative 0.6439, 0.8808, 0.9679, 1).
  const std::vector<float> logits = {3.0f, 1.0f, 2.0f, 0.0f};
  struct Case {
    float t;
    int64_t top_k;
    float top_p;
    std::vector<int> kept;  // derived by hand
  };
  const std::vector<Case> cases = {
      {1.0f, 2, 1.0f, {0, 2}},     {1.0f, 0, 0.5f, {0}},       {1.0f, 0, 0.7f, {0, 2}},
      {1.0f, 0, 0.9f, {0, 2, 1}},  {1.0f, 3, 0.99f, {0, 2, 1}}, {1.0f, 1, 1.0f, {0}},
      {2.0f, 0, 0.5f, {0, 2}},     {0.5f, 0, 0.85f, {0}},       {1.0f, 2, 0.95f, {0, 2}},
  };
  for (const Case& c : cases) {
    const auto want = filtered_softmax(logits, c.t, c.top_k, c.top_p);
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(want[i] > 0, std::count(c.kept.begin(), c.kept.end(), static_cast<int>(i)) == 1)
          << "the reference's kept set, token " << i;
    Sampler sampler({.temperature = c.t, .top_p = c.top_p, .top_k = c.top_k, .seed = 7});
    constexpr int kDraws = 100000;
    std::vector<int> counts(logits.size());
    for (int i = 0; i < kDraws; ++i) ++counts.at(static_cast<std::size_t>(sampler.sample(logits)));
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double f = static_cast<double>(counts[i]) / kDraws, sigma = std::sqrt(want[i] * (1 - want[i]) / kDraws);
      EXPECT_NEAR(f, want[i], 5 * sigma + 1e-9)
          << "T " << c.t << " top_k " << c.top_k << " top_p " << c.top_p << " token " << i;
    }
  }
}

TEST(Sampler, FilterTiesGoToTheLowerIndex) {
  // Six equal logits and two smaller: top_k 4 keeps tokens 1, 2, 3, 5 (the first four of the equal
  // ones), each drawn a quarter of the time; top_p 0.3 keeps the first two of them (each 1/6 of the
  // mass before the cut: two reach 1/3).
  const std::vector<float> logits = {-1.0f, 5.0f, 5.0f, 5.0f, -2.0f, 5.0f, 5.0f, 5.0f};
  for (const auto& [top_k, top_p, kept] : std::vector<std::tuple<int64_t, float, std::vector<int>>>{
           {4, 1.0f, {1, 2, 3, 5}}, {0, 0.3f, {1, 2}}, {5, 0.5f, {1, 2, 3}}}) {
    Sampler sampler({.temperature = 1.0f, .top_p = top_p, .top_k = top_k, .seed = 3});
    std::vector<int> counts(logits.size());
    constexpr int kDraws = 40000;
    for (int i = 0; i < kDraws; ++i) ++counts.at(static_cast<std::size_t>(sampler.sample(logits)));
    for (std::size_t i = 0; i < logits.size(); ++i) {
      const bool in = std::count(kept.begin(), kept.end(), static_cast<int>(i)) == 1;
      const double p = in ? 1.0 / static_cast<double>(kept.size()) : 0.0;
      EXPECT_NEAR(static_cast<double>(counts[i]) / kDraws, p, 5 * std::sqrt(p * (1 - p) / kDraws) + 1e-9)
          << "top_k " << top_k << " top_p " << top_p << " token " << i;
    }
  }
}

TEST(SamplingFilter, OrderKeyIsMonotoneWithNanLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> ascending = {-INFINITY, -3e38f, -1.0f, -1e-40f, -0.0f, 0.0f, 1e-40f, 1.0f, 3e38f, INFINITY};
  EXPECT_EQ(order_key(nan), 0u);
  for (std::size_t i = 0; i < ascending.size(); ++i) {
    EXPECT_GT(order_key(ascending[i]), 0u);
    if (i > 0) {
      EXPECT_LT(order_key(ascending[i - 1]), order_key(ascending[i])) << ascending[i];
    }
    const float back = order_value(order_key(ascending[i]));
    EXPECT_EQ(std::memcmp(&back, &ascending[i], sizeof back), 0) << ascending[i];
  }
}

TEST(SamplingFilter, NucleusWeightFollowsExp) {
  EXPECT_EQ(nucleus_weight(2.5f, 2.5f, 0.7f), uint64_t{1} << 32);  // the most likely token
  EXPECT_EQ(nucleus_weight(-INFINITY, 2.5f, 1.0f), 0u);
  EXPECT_EQ(nucleus_weight(std::numeric_limits<float>::quiet_NaN(), 2.5f, 1.0f), 0u);
  EXPECT_EQ(nucleus_weight(-30.0f, 0.0f, 1.0f), 0u);  // e^-30 < 2^-32
  for (float x = -22.0f; x <= 0.0f; x += 0.01f) {
    const double want = std::exp(double{x}) * 0x1.0p32, got = static_cast<double>(nucleus_weight(x, 0.0f, 1.0f));
    EXPECT_NEAR(got, want, want * 3e-5 + 1.0) << x;
  }
  EXPECT_EQ(nucleus_target(1.0f, 1000), 0u);
  EXPECT_EQ(nucleus_target(0.5f, 1001), 501u);
  EXPECT_EQ(nucleus_target(0.25f, 1000), 250u);
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
  const int64_t rows = 7, vocab = 5000;
  const std::vector<SamplingParams> params = {{.temperature = 0.0f},
                                              {.temperature = 0.7f, .seed = 1},
                                              {.temperature = 1.3f, .seed = 2},
                                              {.temperature = 1.0f, .top_k = 1, .seed = 3},  // greedy
                                              {.temperature = 1.0f, .top_k = 40, .seed = 4},
                                              {.temperature = 0.8f, .top_p = 0.9f, .seed = 5},
                                              {.temperature = 1.5f, .top_p = 0.5f, .top_k = 100, .seed = 6}};
  std::vector<Sampler> host, device;
  for (const SamplingParams& p : params) host.emplace_back(p), device.emplace_back(p);
  CpuOps ops;
  for (int step = 0; step < 20; ++step) {
    Tensor logits = Tensor::zeros(DType::kF32, {rows, vocab});
    for (int64_t i = 0; i < rows * vocab; ++i) logits.data<float>()[i] = 3 * normal(rng);
    Tensor temperatures = Tensor::zeros(DType::kF32, {rows}), keys = Tensor::zeros(DType::kI64, {rows});
    Tensor top_k = Tensor::zeros(DType::kI32, {rows}), top_p = Tensor::zeros(DType::kF32, {rows});
    for (int64_t r = 0; r < rows; ++r) {
      top_p.data<float>()[r] = device[r].top_p();
      if (!device[r].greedy()) {
        temperatures.data<float>()[r] = device[r].temperature();
        keys.data<int64_t>()[r] = static_cast<int64_t>(device[r].next_key());
        top_k.data<int32_t>()[r] = static_cast<int32_t>(device[r].top_k());
      }
    }
    Tensor ids = Tensor::zeros(DType::kI32, {rows});
    ops.sample(logits, {.temperatures = temperatures, .keys = keys, .top_k = top_k, .top_p = top_p}, ids);
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(ids.data<int32_t>()[r],
                host[r].sample({logits.data<float>() + r * vocab, static_cast<std::size_t>(vocab)}))
          << "step " << step << " row " << r;
  }
}

}  // namespace
}  // namespace nibble
