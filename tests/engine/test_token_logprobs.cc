// Log-probabilities: token_logprobs against hand-derived values, and the engine's against the log-softmax
// of the model's own logits computed here (the single-sequence generator's prefill of the prompt and
// the generated tokens, in long double), for greedy and seeded requests batched with others.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "cpu/cpu_ops.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/token_logprobs.h"
#include "model/loader.h"

namespace nibble {
namespace {

TEST(TokenLogprobs, HandDerived) {
  // Probabilities 1/6, 2/6, 3/6: log-probabilities ln 1/6, ln 1/3, ln 1/2.
  const std::vector<float> logits = {std::log(1.0f), std::log(2.0f), std::log(3.0f)};
  const TokenLogprobs a = token_logprobs(logits, 0, 2);
  EXPECT_NEAR(a.logprob, std::log(1.0 / 6), 1e-6);
  ASSERT_EQ(a.top.size(), 2u);
  EXPECT_EQ(a.top[0].first, 2);
  EXPECT_NEAR(a.top[0].second, std::log(0.5), 1e-6);
  EXPECT_EQ(a.top[1].first, 1);
  EXPECT_NEAR(a.top[1].second, std::log(1.0 / 3), 1e-6);
  EXPECT_TRUE(token_logprobs(logits, 1, 0).top.empty());
  EXPECT_EQ(token_logprobs(logits, 1, 10).top.size(), 3u);  // k past the vocabulary: all of it
  // Ties go to the lower id; -inf has probability 0; a huge logit does not overflow.
  const std::vector<float> tied = {1.0f, 5.0f, 5.0f, -std::numeric_limits<float>::infinity(), 1.0f};
  const TokenLogprobs b = token_logprobs(tied, 3, 3);
  EXPECT_EQ(b.logprob, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(b.top[0].first, 1);
  EXPECT_EQ(b.top[1].first, 2);
  EXPECT_EQ(b.top[2].first, 0);
  const std::vector<float> huge = {1e30f, 0.0f};
  EXPECT_EQ(token_logprobs(huge, 0, 0).logprob, 0.0f);
  EXPECT_EQ(token_logprobs(huge, 1, 0).logprob, -1e30f);
}

TEST(TokenLogprobs, EngineMatchesTheModelsLogSoftmax) {
  constexpr char kModel[] = "tests/fixtures/tiny-mixtral";
  CpuOps ops;
  ModelConfig config = load_model_config(kModel);
  ModelWeights w = load_weights(Checkpoint::open(kModel), config, Quantization::kQuarkInt4Fp8Moe, ops);
  Model model(std::move(config), std::move(w), ops);
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7, 8}, {9, 10}, {11, 12, 13, 14, 15, 16}};
  Engine engine(model, {.num_blocks = 64, .block_size = 4, .scheduler = {.max_running = 3, .max_batched_tokens = 16}});
  std::map<int64_t, std::size_t> index;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    RequestParams params{.max_tokens = 6, .ignore_eos = true, .logprobs = static_cast<int32_t>(i) * 3};
    if (i == 1) params.sampling = {.temperature = 1.0f, .seed = 3, .penalties = {.repetition = 1.5f}};
    index[engine.add_request(prompts[i], params)] = i;
  }
  std::vector<std::vector<StepOutput>> outputs(prompts.size());
  while (engine.has_unfinished())
    for (StepOutput& o : engine.step()) outputs[index.at(o.id)].push_back(std::move(o));
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ids = prompts[i];
    for (const StepOutput& o : outputs[i]) ids.push_back(o.token);
    const auto n = static_cast<int64_t>(outputs[i].size());
    ASSERT_EQ(n, 6);
    // The logits of the positions that predicted each generated token, in one prefill.
    Generator generator(model, static_cast<int64_t>(ids.size()), KvCacheDType::kBf16);
    const std::vector<int32_t> context(ids.begin(), ids.end() - 1);
    const Tensor logits = generator.extend(context, n);
    const int64_t V = logits.dim(1);
    for (int64_t j = 0; j < n; ++j) {
      const float* row = logits.data<float>() + j * V;
      long double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<long double>(row[v]));
      auto want = [&](int32_t t) { return static_cast<double>(row[t] - std::log(z)); };
      const StepOutput& o = outputs[i][static_cast<std::size_t>(j)];
      ASSERT_TRUE(o.logprobs.has_value()) << "request " << i << " token " << j;
      // The model's raw log-probabilities (the penalties of request 1 do not enter them).
      EXPECT_NEAR(o.logprobs->logprob, want(o.token), 1e-3) << "request " << i << " token " << j;
      ASSERT_EQ(o.logprobs->top.size(), i * 3);
      for (std::size_t r = 0; r < o.logprobs->top.size(); ++r) {
        EXPECT_NEAR(o.logprobs->top[r].second, want(o.logprobs->top[r].first), 1e-3);
        if (r > 0) {
          EXPECT_GE(o.logprobs->top[r - 1].second, o.logprobs->top[r].second);
        }
      }
      if (i == 2) {
        EXPECT_EQ(o.logprobs->top[0].first, o.token);  // greedy: the most likely one
      }
    }
  }
}

// Prompt log-probabilities, the prompt computed in chunks of a few tokens beside other requests (and
// beside a request that shares its first blocks, which it must not take from the cache): each prompt
// token's against the log-softmax of the prompt's own logits from one prefill.
TEST(TokenLogprobs, PromptLogprobsMatchOnePrefill) {
  constexpr char kModel[] = "tests/fixtures/tiny-mixtral";
  CpuOps ops;
  ModelConfig config = load_model_config(kModel);
  ModelWeights w = load_weights(Checkpoint::open(kModel), config, Quantization::kQuarkInt4Fp8Moe, ops);
  Model model(std::move(config), std::move(w), ops);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 23; ++i) prompt.push_back(3 + (i * 37) % 500);
  Engine engine(model, {.num_blocks = 64, .block_size = 4, .scheduler = {.max_running = 4, .max_batched_tokens = 8}});
  engine.add_request(prompt, {.max_tokens = 3, .ignore_eos = true});  // caches the prompt's blocks first
  while (engine.has_unfinished()) engine.step();
  const int64_t id = engine.add_request(prompt, {.max_tokens = 2, .ignore_eos = true, .prompt_logprobs = 2});
  engine.add_request({7, 8, 9, 10, 11, 12}, {.max_tokens = 5, .ignore_eos = true});
  const int64_t one = engine.add_request({42}, {.max_tokens = 1, .ignore_eos = true, .prompt_logprobs = 1});
  std::map<int64_t, std::vector<StepOutput>> out;
  int steps = 0, steps_to_first_token = 0;
  while (engine.has_unfinished()) {
    ++steps;
    for (StepOutput& o : engine.step()) {
      if (o.id == id && out[id].empty()) steps_to_first_token = steps;
      out[o.id].push_back(std::move(o));
    }
  }
  ASSERT_EQ(out[one].front().prompt_logprobs.size(), 1u);
  // The scheduler's cut (at most max_running = 4 prompt rows a step): 22 rows take 6 steps at least.
  EXPECT_GE(steps_to_first_token, 6);
  EXPECT_FALSE(out[one].front().prompt_logprobs[0].has_value());
  const auto& first = out[id].front();
  ASSERT_EQ(first.prompt_logprobs.size(), prompt.size());
  EXPECT_FALSE(first.prompt_logprobs[0].has_value());
  EXPECT_TRUE(out[id].back().prompt_logprobs.empty());  // handed out once
  Generator generator(model, static_cast<int64_t>(prompt.size()), KvCacheDType::kBf16);
  const auto n = static_cast<int64_t>(prompt.size());
  const Tensor logits = generator.extend(prompt, n);
  const int64_t V = logits.dim(1);
  for (int64_t p = 1; p < n; ++p) {
    const float* row = logits.data<float>() + (p - 1) * V;
    long double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<long double>(row[v]));
    const auto& lp = first.prompt_logprobs[static_cast<std::size_t>(p)];
    ASSERT_TRUE(lp.has_value()) << "prompt token " << p;
    EXPECT_NEAR(lp->logprob, static_cast<double>(row[prompt[static_cast<std::size_t>(p)]] - std::log(z)), 1e-3)
        << "prompt token " << p;
    ASSERT_EQ(lp->top.size(), 2u);
    EXPECT_NEAR(lp->top[0].second, static_cast<double>(row[lp->top[0].first] - std::log(z)), 1e-3);
  }
}

}  // namespace
}  // namespace nibble
