// From a parsed request to engine input: prompts tokenized (chat through the template), defaults
// for max_tokens, and the context / KV cache / vocabulary limits as 400s naming the field.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/prepare.h"

namespace nibble {
namespace {

class PrepareTest : public ::testing::Test {
 protected:
  PreparedRequest run(std::string_view body, Endpoint endpoint = Endpoint::kCompletion) {
    const GenerationRequest r =
        endpoint == Endpoint::kChat ? parse_chat_request(body) : parse_completion_request(body);
    return prepare(r, tokenizer_, chat_, limits_);
  }
  std::string rejected_param(std::string_view body, Endpoint endpoint = Endpoint::kCompletion) {
    try {
      run(body, endpoint);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      return e.param();
    }
    return "(accepted)";
  }

  Tokenizer tokenizer_ = Tokenizer::load("tests/fixtures/tiny-mixtral");
  ChatTemplate chat_ = ChatTemplate::chatml();
  ModelLimits limits_{.context_length = 64, .kv_capacity = 48, .vocab_size = 512};
};

TEST_F(PrepareTest, CompletionPromptAndDefaults) {
  const PreparedRequest p = run(R"({"prompt": "Hello world", "temperature": 0.5, "seed": 9})");
  EXPECT_EQ(p.prompt, tokenizer_.encode("Hello world"));  // BOS included
  EXPECT_EQ(p.params.max_tokens, kDefaultCompletionMaxTokens);
  EXPECT_EQ(p.params.sampling.temperature, 0.5f);
  EXPECT_EQ(p.params.sampling.seed, 9u);
  EXPECT_EQ(run(R"({"prompt": [1, 2, 3], "max_tokens": 7})").prompt,
            (std::vector<int32_t>{1, 2, 3}));
}

TEST_F(PrepareTest, ChatUsesTheTemplateWithoutAddingBos) {
  const PreparedRequest p =
      run(R"({"messages": [{"role": "user", "content": "Hi"}]})", Endpoint::kChat);
  const std::string text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(p.prompt, tokenizer_.encode(text, AddSpecialTokens::kNo));
  // Chat's default fills what is left of the context and the KV cache, whichever is smaller.
  EXPECT_EQ(p.params.max_tokens, 48 - static_cast<int64_t>(p.prompt.size()));
}

TEST_F(PrepareTest, UnseededRequestsGetDifferentSeeds) {
  EXPECT_NE(run(R"({"prompt": "a"})").params.sampling.seed,
            run(R"({"prompt": "a"})").params.sampling.seed);
}

TEST_F(PrepareTest, Limits) {
  EXPECT_EQ(rejected_param(R"({"prompt": [1, 512]})"), "prompt");  // outside the vocabulary
  std::string long_prompt = R"({"prompt": [)";
  for (int i = 0; i < 48; ++i) long_prompt += (i ? ",5" : "5");
  EXPECT_EQ(rejected_param(long_prompt + "]}"), "prompt");  // fills the whole KV cache
  EXPECT_EQ(rejected_param(R"({"prompt": [1, 2], "max_tokens": 63})"),
            "max_tokens");  // past the context
  EXPECT_EQ(rejected_param(R"({"prompt": [1, 2], "max_tokens": 47})"),
            "max_tokens");  // past the KV cache
  EXPECT_EQ(rejected_param(R"({"prompt": [1, 2], "max_tokens": 46})"), "(accepted)");
  EXPECT_EQ(rejected_param(R"({"prompt": [1, 2], "stop_token_ids": [3, 512]})"), "stop_token_ids");
}

TEST_F(PrepareTest, EchoWithLogprobsAsksForThePrompts) {
  EXPECT_EQ(run(R"({"prompt": "a", "logprobs": 3, "echo": true})").params.prompt_logprobs, 3);
  EXPECT_EQ(run(R"({"prompt": "a", "logprobs": 3})").params.prompt_logprobs, -1);
  EXPECT_EQ(run(R"({"prompt": "a", "echo": true})").params.prompt_logprobs, -1);
}

TEST_F(PrepareTest, MinTokens) {
  EXPECT_EQ(run(R"({"prompt": "a", "max_tokens": 8, "min_tokens": 8})").params.min_tokens, 8);
  EXPECT_EQ(rejected_param(R"({"prompt": "a", "max_tokens": 8, "min_tokens": 9})"), "min_tokens");
}

TEST_F(PrepareTest, StopTokenIdsReachTheEngine) {
  EXPECT_EQ(run(R"({"prompt": "a", "stop_token_ids": [0, 511, 7]})").params.stop_token_ids,
            (std::vector<int64_t>{0, 511, 7}));
  EXPECT_TRUE(run(R"({"prompt": "a"})").params.stop_token_ids.empty());
}

TEST_F(PrepareTest, TokenizeAsTheGenerationPromptIs) {
  const auto ids = [&](std::string_view body) { return tokenize(parse_tokenize_request(body), tokenizer_, chat_); };
  EXPECT_EQ(ids(R"({"prompt": "Hello world"})"), run(R"({"prompt": "Hello world"})").prompt);  // BOS included
  EXPECT_EQ(ids(R"({"prompt": "Hello world", "add_special_tokens": false})"),
            tokenizer_.encode("Hello world", AddSpecialTokens::kNo));
  const char* messages = R"("messages": [{"role": "user", "content": "Hi"}])";
  EXPECT_EQ(ids(std::string("{") + messages + "}"), run(std::string("{") + messages + "}", Endpoint::kChat).prompt);
  EXPECT_EQ(ids(std::string("{") + messages + R"(, "add_generation_prompt": false})"),
            tokenizer_.encode("<|im_start|>user\nHi<|im_end|>\n", AddSpecialTokens::kNo));
  const std::vector<int32_t> hello = tokenizer_.encode("Hello world", AddSpecialTokens::kNo);
  std::string body = R"({"tokens": [)";
  for (std::size_t i = 0; i < hello.size(); ++i) body += (i ? "," : "") + std::to_string(hello[i]);
  EXPECT_EQ(detokenize(parse_detokenize_request(body + "]}"), tokenizer_, limits_), "Hello world");
  try {
    detokenize(parse_detokenize_request(R"({"tokens": [1, 512]})"), tokenizer_, limits_);
    ADD_FAILURE() << "an id outside the vocabulary was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "tokens");
  }
}

}  // namespace
}  // namespace nibble
