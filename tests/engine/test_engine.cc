// The engine on the CPU backend and the tiny Mixtral: continuous batching, chunked prefill, prefix
// sharing and preemption never change a greedy or seeded result (each request equals the same request
// served alone by the single-sequence generator), and every KV block comes back.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "cpu/cpu_ops.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "model/loader.h"

namespace nibble {
namespace {

constexpr char kModel[] = "tests/fixtures/tiny-mixtral";

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelConfig config = load_model_config(kModel);
    ModelWeights w = load_weights(Checkpoint::open(kModel), config, Quantization::kQuarkInt4Fp8Moe, ops_);
    model_ = std::make_unique<Model>(std::move(config), std::move(w), ops_);
  }

  struct Request {
    std::vector<int32_t> prompt;
    int64_t max_tokens;
    SamplingParams sampling = {};  // greedy unless set
  };

  std::vector<Request> mixed_requests(int count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> shared_prefix;
    for (int i = 0; i < 20; ++i) shared_prefix.push_back(static_cast<int32_t>(rng() % 500) + 3);
    std::vector<Request> out;
    for (int i = 0; i < count; ++i) {
      Request r;
      if (i % 3 == 0) r.prompt = shared_prefix;  // a third share a 20-token prefix
      const int len = 1 + static_cast<int>(rng() % 40);
      for (int j = 0; j < len; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % 500) + 3);
      r.max_tokens = 1 + static_cast<int64_t>(rng() % 24);
      out.push_back(r);
    }
    return out;
  }

  std::vector<int32_t> alone(const Request& r) {
    return generate(*model_, r.prompt, r.max_tokens, r.sampling, KvCacheDType::kBf16, {});
  }

  // Serves all requests at once; returns each one's tokens.
  std::vector<std::vector<int32_t>> batched(const std::vector<Request>& requests, EngineConfig config) {
    Engine engine(*model_, config);
    std::map<int64_t, std::size_t> index;
    for (std::size_t i = 0; i < requests.size(); ++i)
      index[engine.add_request(requests[i].prompt, {.sampling = requests[i].sampling,
                                                    .max_tokens = requests[i].max_tokens,
                                                    .ignore_eos = true})] = i;
    std::vector<std::vector<int32_t>> out(requests.size());
    int steps = 0;
    while (engine.has_unfinished()) {
      for (const StepOutput& o : engine.step()) out[index.at(o.id)].push_back(o.token);
      EXPECT_LT(++steps, 5000);
      if (steps >= 5000) break;
    }
    EXPECT_EQ(engine.num_free_blocks(), config.num_blocks);
    preemptions_ = engine.num_preemptions();
    return out;
  }

  CpuOps ops_;
  std::unique_ptr<Model> model_;
  int64_t preemptions_ = 0;
};

TEST_F(EngineTest, BatchingDoesNotChangeGreedyResults) {
  const auto requests = mixed_requests(24, 1);
  const auto got = batched(requests, {.num_blocks = 256, .block_size = 4,
                                      .scheduler = {.max_running = 8, .max_batched_tokens = 48}});
  for (std::size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i], alone(requests[i])) << "request " << i;
}

// Seeded random sampling beside greedy requests: a step of greedy sequences takes Ops::argmax, any
// other step Ops::sample's draws (temperature alone, top-p, top-k); either way each request equals
// itself served alone, and a seed reproduces its sample.
TEST_F(EngineTest, SeededSamplingBesideGreedyMatchesServedAlone) {
  auto requests = mixed_requests(12, 2);
  for (std::size_t i = 1; i < requests.size(); i += 2)
    requests[i].sampling = {.temperature = 0.8f,
                            .top_p = i % 4 == 1 ? 0.9f : 1.0f,
                            .top_k = i % 6 == 3 ? 20 : 0,
                            .seed = 100 + i};
  const auto got = batched(requests, {.num_blocks = 256, .block_size = 4,
                                      .scheduler = {.max_running = 6, .max_batched_tokens = 48}});
  for (std::size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i], alone(requests[i])) << "request " << i;
  // The seeds matter: another seed gives another continuation for at least one request.
  bool differs = false;
  for (std::size_t i = 1; i < requests.size(); i += 2) {
    Request other = requests[i];
    other.sampling.seed += 1;
    differs = differs || alone(other) != got[i];
  }
  EXPECT_TRUE(differs);
}

// Penalties (repetition, frequency, presence; greedy and seeded) beside requests without: each request
// equals itself served alone, where the single-sequence generator penalizes its own logits (the engine
// batches them as rows of Ops::penalize), and the penalties change what is generated.
TEST_F(EngineTest, PenalizedRequestsMatchServedAlone) {
  auto requests = mixed_requests(12, 3);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    requests[i].max_tokens = 16 + static_cast<int64_t>(i % 4);
    if (i % 4 == 3) {  // no penalties; a bias on a few tokens for half of them
      if (i % 8 == 3) requests[i].sampling.logit_bias = {{7, 3.0f}, {300, -2.0f}, {451, 5.0f}};
      continue;
    }
    if (i % 3 == 1) requests[i].sampling.logit_bias = {{11, 4.0f}, {12, -50.0f}};
    requests[i].sampling.penalties = {.repetition = i % 4 == 0 ? 1.8f : 1.0f,
                                      .frequency = i % 4 == 1 ? 1.5f : 0.0f,
                                      .presence = i % 4 == 2 ? 2.0f : 0.3f};
    if (i % 3 == 2) requests[i].sampling.temperature = 0.9f, requests[i].sampling.seed = 50 + i;
  }
  const auto got = batched(requests, {.num_blocks = 256, .block_size = 4,
                                      .scheduler = {.max_running = 6, .max_batched_tokens = 48}});
  bool changed = false;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i], alone(requests[i])) << "request " << i;
    Request plain = requests[i];
    plain.sampling.penalties = {};
    plain.sampling.logit_bias = {};
    changed = changed || (requests[i].sampling.penalties.any() && alone(plain) != got[i]);
  }
  EXPECT_TRUE(changed) << "no penalty changed any generation";
}

// logit_bias: +100 on a token makes greedy decoding pick it at every step, -100 on the greedy first
// token makes it pick another.
TEST_F(EngineTest, LogitBiasSteersGreedyDecoding) {
  const std::vector<int32_t> prompt{5, 6, 7, 8};
  Request forced{.prompt = prompt, .max_tokens = 6};
  forced.sampling.logit_bias = {{77, 100.0f}};
  EXPECT_EQ(batched({forced}, {.num_blocks = 32, .block_size = 4})[0], std::vector<int32_t>(6, 77));
  const int32_t first = alone({.prompt = prompt, .max_tokens = 1})[0];
  Request avoided{.prompt = prompt, .max_tokens = 1};
  avoided.sampling.logit_bias = {{first, -100.0f}};
  EXPECT_NE(batched({avoided}, {.num_blocks = 32, .block_size = 4})[0][0], first);
}

// min_tokens: no stop token is sampled before that many tokens, batched beside others; after it the
// stop tokens end requests as before.
TEST_F(EngineTest, MinTokensHoldsOffStopTokens) {
  Engine engine(*model_, {.num_blocks = 128, .block_size = 4, .scheduler = {.max_running = 4, .max_batched_tokens = 32}});
  std::vector<int64_t> stops;
  for (int64_t t = 0; t < 400; ++t) stops.push_back(t);  // most of the vocabulary (512)
  std::map<int64_t, int64_t> min_of;
  for (int64_t i = 0; i < 4; ++i) {
    RequestParams params{.max_tokens = 12, .stop_token_ids = stops, .min_tokens = 2 * i + 2};
    if (i % 2) params.sampling = {.temperature = 1.0f, .seed = static_cast<uint64_t>(i)};
    min_of[engine.add_request({5, 6, 7, static_cast<int32_t>(100 + i)}, params)] = params.min_tokens;
  }
  std::map<int64_t, std::vector<int32_t>> out;
  std::map<int64_t, FinishReason> reason;
  while (engine.has_unfinished())
    for (const StepOutput& o : engine.step()) {
      out[o.id].push_back(o.token);
      if (o.finished) reason[o.id] = o.reason;
    }
  for (const auto& [id, tokens] : out) {
    const int64_t min = min_of.at(id);
    ASSERT_GE(static_cast<int64_t>(tokens.size()), min) << "request " << id;
    for (int64_t j = 0; j < min; ++j) EXPECT_GE(tokens[static_cast<std::size_t>(j)], 400) << "request " << id;
    if (reason.at(id) == FinishReason::kStop) {
      EXPECT_LT(tokens.back(), 400);
    }
  }
}

TEST_F(EngineTest, PreemptionByRecomputeKeepsResults) {
  const auto requests = mixed_requests(12, 2);
  // 24 blocks of 4 tokens: far fewer than the requests need together.
  const auto got = batched(requests, {.num_blocks = 24, .block_size = 4,
                                      .scheduler = {.max_running = 12, .max_batched_tokens = 64}});
  EXPECT_GT(preemptions_, 0);
  for (std::size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i], alone(requests[i])) << "request " << i;
}

TEST_F(EngineTest, AbortFreesBlocks) {
  Engine engine(*model_, {.num_blocks = 64, .block_size = 4});
  const int64_t a = engine.add_request({5, 6, 7, 8, 9, 10, 11}, {.max_tokens = 50, .ignore_eos = true});
  const int64_t b = engine.add_request({5, 6, 7}, {.max_tokens = 50, .ignore_eos = true});
  engine.step();
  engine.step();
  EXPECT_LT(engine.num_free_blocks(), 64);
  EXPECT_TRUE(engine.abort(a));
  EXPECT_TRUE(engine.abort(b));
  EXPECT_FALSE(engine.abort(b));
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.num_free_blocks(), 64);
}

TEST_F(EngineTest, RejectsWhatCanNeverFit) {
  Engine engine(*model_, {.num_blocks = 4, .block_size = 4});
  EXPECT_THROW(engine.add_request({1, 2, 3}, {.max_tokens = 100}), Error);  // more than the KV cache
  EXPECT_THROW(engine.add_request({1, 99999}, {.max_tokens = 1}), Error);   // outside the vocabulary
  EXPECT_THROW(engine.add_request({}, {.max_tokens = 1}), Error);
  EXPECT_THROW(engine.add_request({1}, {.max_tokens = 0}), Error);
  EXPECT_FALSE(engine.has_unfinished());
}

}  // namespace
}  // namespace nibble
