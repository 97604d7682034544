// Sampling penalties: the penalized logit against hand-derived values (vLLM's order: the repetition
// penalty on every seen token, then frequency × count + presence on generated ones), Ops::penalize's
// rows in CSR form, and a sequence's seen tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/logit_penalties.h"
#include "cpu/cpu_ops.h"
#include "engine/sequence.h"

namespace nibble {
namespace {

TEST(Penalties, PenalizedLogitHandDerived) {
  // Repetition alone: positive logits divided, the rest multiplied.
  EXPECT_EQ(penalized_logit(2.0f, 0, 0.0f, 2.0f, 0.5f, 0.25f), 1.0f);  // prompt only: no frequency, presence
  EXPECT_EQ(penalized_logit(-2.0f, 0, 0.0f, 2.0f, 0.5f, 0.25f), -4.0f);
  EXPECT_EQ(penalized_logit(0.0f, 0, 0.0f, 2.0f, 0.0f, 0.0f), 0.0f);
  // Generated 3 times: 2 − 0.5·3 − 0.25.
  EXPECT_EQ(penalized_logit(2.0f, 3, 0.0f, 1.0f, 0.5f, 0.25f), 0.25f);
  // Both: −1 · 1.5 = −1.5, then −(−0.5 · 1) − 1 = −2.
  EXPECT_EQ(penalized_logit(-1.0f, 1, 0.0f, 1.5f, -0.5f, 1.0f), -2.0f);
  // Negative presence raises: 0 · 4 = 0, then − 1 · 2 − (−2) = 0.
  EXPECT_EQ(penalized_logit(0.0f, 2, 0.0f, 4.0f, 1.0f, -2.0f), 0.0f);
  // logit_bias first: 2 + 2 = 4, then / 2 = 2, − 0.5 − 0.25 = 1.25.
  EXPECT_EQ(penalized_logit(2.0f, 1, 2.0f, 2.0f, 0.5f, 0.25f), 1.25f);
  // A biased token not seen: its bias alone (no repetition penalty).
  EXPECT_EQ(penalized_logit(-1.0f, kNotSeen, -3.0f, 2.0f, 1.0f, 1.0f), -4.0f);
  // A banned token (a stop token before min_tokens) cannot be sampled.
  EXPECT_EQ(penalized_logit(7.0f, kBanned, 0.0f, 1.0f, 0.0f, 0.0f), -INFINITY);
  EXPECT_FALSE(Penalties{}.any());
  EXPECT_TRUE((Penalties{.presence = 0.1f}).any());
}

Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::zeros(DType::kI32, {static_cast<int64_t>(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}

TEST(Penalties, OpsPenalizeRowsInCsrForm) {
  const int64_t R = 3, V = 5;
  Tensor logits = Tensor::zeros(DType::kF32, {R, V});
  for (int64_t i = 0; i < R * V; ++i) logits.data<float>()[i] = static_cast<float>(i % V) - 2.0f;  // -2 .. 2
  // Row 0: tokens 4 (generated twice) and 0 (prompt only); row 1: none; row 2: token 1 (generated once).
  Tensor penalties = Tensor::zeros(DType::kF32, {R, 3});
  const float p[] = {2.0f, 0.5f, 1.0f, /**/ 3.0f, 1.0f, 1.0f, /**/ 1.0f, 0.0f, 2.0f};
  for (int i = 0; i < 9; ++i) penalties.data<float>()[i] = p[i];
  CpuOps ops;
  Tensor bias = Tensor::zeros(DType::kF32, {3});
  ops.penalize(logits, {.row_offsets = i32({0, 2, 2, 3}),
                        .tokens = i32({4, 0, 1}),
                        .generated = i32({2, 0, 1}),
                        .bias = bias,
                        .penalties = penalties});
  const std::vector<float> want = {
      -4.0f, -1.0f, 0.0f, 1.0f, 2.0f / 2.0f - 0.5f * 2.0f - 1.0f,  // row 0: -2·2; 2/2 − 1 − 1
      -2.0f, -1.0f, 0.0f, 1.0f, 2.0f,                              // row 1 untouched
      -2.0f, -1.0f - 2.0f, 0.0f, 1.0f, 2.0f};                      // row 2: −1 − 0 − 2
  for (int64_t i = 0; i < R * V; ++i) EXPECT_EQ(logits.data<float>()[i], want[static_cast<std::size_t>(i)]) << i;
}

TEST(Penalties, SequenceSeenTokens) {
  auto sequence = [](Penalties p) {
    Sequence s(1, {5, 3, 5}, {.sampling = {.penalties = p}, .max_tokens = 8});
    for (int32_t t : {3, 7, 3}) s.append(t);
    return s.seen_tokens();
  };
  // With a repetition penalty the prompt's tokens count too (generated 0 unless generated).
  EXPECT_EQ(sequence({.repetition = 1.2f}), (std::vector<SeenToken>{{3, 2}, {5, 0}, {7, 1}}));
  // Without one only the generated tokens matter.
  EXPECT_EQ(sequence({.frequency = 0.5f}), (std::vector<SeenToken>{{3, 2}, {7, 1}}));
  EXPECT_TRUE(sequence({}).empty());
}

TEST(Penalties, LogitBiasEntries) {
  Sequence s(1, {5, 3}, {.sampling = {.penalties = {.repetition = 1.5f}, .logit_bias = {{3, 2.0f}, {8, -1.0f}}},
                         .max_tokens = 8});
  s.append(8);
  // 3: in the prompt, biased; 5: in the prompt; 8: generated once, biased.
  EXPECT_EQ(s.seen_tokens(), (std::vector<SeenToken>{{3, 0, 2.0f}, {5, 0, 0.0f}, {8, 1, -1.0f}}));
  Sequence plain(2, {5, 3}, {.sampling = {.logit_bias = {{3, 2.0f}}}, .max_tokens = 8});
  EXPECT_TRUE(plain.adjusts_logits());
  EXPECT_EQ(plain.seen_tokens(), (std::vector<SeenToken>{{3, kNotSeen, 2.0f}}));  // no penalties: bias alone
}

TEST(Penalties, StopTokensBannedBeforeMinTokens) {
  Sequence s(1, {5, 3}, {.sampling = {.penalties = {.frequency = 0.5f}}, .max_tokens = 8, .stop_token_ids = {9, 3},
                         .min_tokens = 2});
  EXPECT_EQ(s.seen_tokens(), (std::vector<SeenToken>{{3, kBanned}, {9, kBanned}}));
  s.append(3);  // the runner would not let it, but the counts go on
  EXPECT_EQ(s.seen_tokens(), (std::vector<SeenToken>{{3, kBanned}, {9, kBanned}}));
  s.append(4);
  EXPECT_EQ(s.seen_tokens(), (std::vector<SeenToken>{{3, 1}, {4, 1}}));  // two generated: none banned
}

}  // namespace
}  // namespace nibble
