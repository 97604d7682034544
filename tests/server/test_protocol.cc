// Parsing and validation of OpenAI request bodies: what is accepted, the defaults, and that every
// bad field is a 400 naming it.
#include <gtest/gtest.h>

#include <functional>

#include "server/api_error.h"
#include "server/protocol.h"

namespace nibble {
namespace {

// The status and param of the ApiError `body` raises (0 and "" when it parses).
std::pair<int, std::string> rejection(std::string_view body,
                                      Endpoint endpoint = Endpoint::kCompletion) {
  try {
    if (endpoint == Endpoint::kChat)
      parse_chat_request(body);
    else
      parse_completion_request(body);
  } catch (const ApiError& e) {
    return {e.status(), e.param()};
  }
  return {0, ""};
}

TEST(Protocol, CompletionDefaults) {
  const GenerationRequest r = parse_completion_request(R"({"prompt": "Hello", "model": "m"})");
  EXPECT_EQ(r.endpoint, Endpoint::kCompletion);
  EXPECT_EQ(r.prompt_text, "Hello");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.model, "m");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_TRUE(r.stop.empty());
}

TEST(Protocol, CompletionFields) {
  const GenerationRequest r = parse_completion_request(R"({
    "prompt": [1, 2, 3], "max_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": -1,
    "seed": 42,
    "stop": ["a", "bc"], "n": 1, "stream": true, "stream_options": {"include_usage": true},
    "ignore_eos": true, "user": "someone", "logprobs": null, "stop_token_ids": [2, 7],
    "presence_penalty": -0.5, "frequency_penalty": 1.5, "repetition_penalty": 1.25, "min_tokens": 0,
    "logit_bias": {}})");
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 32);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.7f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 0);  // -1: no limit
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(r.sampling.penalties.presence, -0.5f);
  EXPECT_EQ(r.sampling.penalties.frequency, 1.5f);
  EXPECT_EQ(r.sampling.penalties.repetition, 1.25f);
  EXPECT_EQ(parse_completion_request(R"({"prompt": "p", "min_tokens": 3})").min_tokens, 3);
  EXPECT_EQ(parse_completion_request(R"({"prompt": "p", "n": 4})").n, 4);
  EXPECT_TRUE(parse_completion_request(R"({"prompt": "p", "echo": true})").echo);
  EXPECT_EQ(parse_completion_request(R"({"prompt": "p", "logit_bias": {"7": -100, "12": 2.5}})").sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{12, 2.5f}, {7, -100.0f}}));  // in the object's (sorted) order
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "p"})").sampling.penalties.any());
}

TEST(Protocol, SingletonPromptBatchesAndStopString) {
  EXPECT_EQ(parse_completion_request(R"({"prompt": ["one"], "stop": "x"})").prompt_text, "one");
  EXPECT_EQ(parse_completion_request(R"({"prompt": [[5, 6]]})").prompt_ids,
            (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(parse_completion_request(R"({"prompt": "p", "stop": "x"})").stop,
            std::vector<std::string>{"x"});
  EXPECT_EQ(parse_completion_request(R"({"prompt": "p", "max_tokens": 8.0})").max_tokens, 8);
}

TEST(Protocol, Chat) {
  const GenerationRequest r = parse_chat_request(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                   {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null}],
    "max_completion_tokens": 5})");
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1]["content"], "Hi there");
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_EQ(r.max_tokens, 5);
}

TEST(Protocol, RejectsBadCompletions) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", ""},
      {"[]", ""},
      {"\"text\"", ""},
      {"{\"prompt\": \"\xff\"}", ""},  // invalid UTF-8
      {R"({})", "prompt"},
      {R"({"prompt": null})", "prompt"},
      {R"({"prompt": 3})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": [1, -1]})", "prompt"},
      {R"({"prompt": [1, 3000000000]})", "prompt"},
      {R"({"prompt": "p", "model": 3})", "model"},
      {R"({"prompt": "p", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "p", "max_tokens": -1})", "max_tokens"},
      {R"({"prompt": "p", "max_tokens": 2.5})", "max_tokens"},
      {R"({"prompt": "p", "max_tokens": "8"})", "max_tokens"},
      {R"({"prompt": "p", "temperature": 2.1})", "temperature"},
      {R"({"prompt": "p", "temperature": -1})", "temperature"},
      {R"({"prompt": "p", "temperature": true})", "temperature"},
      {R"({"prompt": "p", "top_p": 0})", "top_p"},
      {R"({"prompt": "p", "top_p": 1.01})", "top_p"},
      {R"({"prompt": "p", "top_k": -5})", "top_k"},
      {R"({"prompt": "p", "top_k": 1.5})", "top_k"},
      {R"({"prompt": "p", "seed": 1.5})", "seed"},
      {R"({"prompt": "p", "n": 0})", "n"},
      {R"({"prompt": "p", "n": 129})", "n"},
      {R"({"prompt": "p", "best_of": 3})", "best_of"},
      {R"({"prompt": "p", "echo": 1})", "echo"},
      {R"({"prompt": "p", "suffix": "end"})", "suffix"},
      {R"({"prompt": "p", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "p", "logprobs": -1})", "logprobs"},
      {R"({"prompt": "p", "logprobs": true})", "logprobs"},
      {R"({"prompt": "p", "return_tokens_as_token_ids": 1})", "return_tokens_as_token_ids"},
      {R"({"prompt": "p", "stop": 1})", "stop"},
      {R"({"prompt": "p", "stop": ["a", 1]})", "stop"},
      {R"({"prompt": "p", "stop": ""})", "stop"},
      {R"({"prompt": "p", "stream": 1})", "stream"},
      {R"({"prompt": "p", "stream_options": true})", "stream_options"},
      {R"({"prompt": "p", "stream_options": {"include_usage": "yes"}})",
       "stream_options.include_usage"},
      {R"({"prompt": "p", "ignore_eos": "no"})", "ignore_eos"},
      {R"({"prompt": "p", "stop_token_ids": 3})", "stop_token_ids"},
      {R"({"prompt": "p", "stop_token_ids": [3, -1]})", "stop_token_ids"},
      {R"({"prompt": "p", "stop_token_ids": ["3"]})", "stop_token_ids"},
      {R"({"prompt": "p", "presence_penalty": 3})", "presence_penalty"},
      {R"({"prompt": "p", "presence_penalty": -2.5})", "presence_penalty"},
      {R"({"prompt": "p", "frequency_penalty": "0"})", "frequency_penalty"},
      {R"({"prompt": "p", "repetition_penalty": 0})", "repetition_penalty"},
      {R"({"prompt": "p", "repetition_penalty": -1})", "repetition_penalty"},
      {R"({"prompt": "p", "min_tokens": -1})", "min_tokens"},
      {R"({"prompt": "p", "min_tokens": 1.5})", "min_tokens"},
      {R"({"prompt": "p", "logit_bias": [1]})", "logit_bias"},
      {R"({"prompt": "p", "logit_bias": {"x": 1}})", "logit_bias"},
      {R"({"prompt": "p", "logit_bias": {"-1": 1}})", "logit_bias"},
      {R"({"prompt": "p", "logit_bias": {"5": 101}})", "logit_bias"},
      {R"({"prompt": "p", "logit_bias": {"5": "1"}})", "logit_bias"},
      {R"({"prompt": "p", "logit_bias": {"5": 1, "05": 2}})", "logit_bias"},
  };
  for (const auto& [body, param] : cases) {
    const auto [status, got_param] = rejection(body);
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(got_param, param) << body;
  }
}

TEST(Protocol, RejectsBadChats) {
  const std::vector<std::string> cases = {
      R"({})",
      R"({"messages": []})",
      R"({"messages": {}})",
      R"({"messages": ["hi"]})",
      R"({"messages": [{"content": "hi"}]})",
      R"({"messages": [{"role": "king", "content": "hi"}]})",
      R"({"messages": [{"role": "user"}]})",
      R"({"messages": [{"role": "user", "content": 7}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
      R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 2})",
      R"({"messages": [{"role": "user", "content": "hi"}], "echo": true})",
      R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})",
      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"})",
      R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})",
      R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21})",
      R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})",  // needs logprobs: true
      R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": false, "top_logprobs": 2})",
  };
  for (const std::string& body : cases)
    EXPECT_EQ(rejection(body, Endpoint::kChat).first, 400) << body;
  EXPECT_EQ(
      rejection(R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0})",
                Endpoint::kChat)
          .second,
      "max_completion_tokens");
}

TEST(Protocol, NeutralFormsAreAccepted) {
  EXPECT_NO_THROW(parse_completion_request(R"({"prompt": "p", "suffix": "", "user": "u"})"));
  EXPECT_NO_THROW(parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}], "tools": [],
    "tool_choice": "none", "response_format": {"type": "text"}})"));
}

TEST(Protocol, Logprobs) {
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "p"})").logprobs.has_value());
  EXPECT_EQ(parse_completion_request(R"({"prompt": "p", "logprobs": 0})").logprobs, 0);
  EXPECT_EQ(parse_completion_request(R"({"prompt": "p", "logprobs": 20})").logprobs, 20);
  const GenerationRequest ids = parse_completion_request(R"({"prompt": "p", "logprobs": 1,
                                                             "return_tokens_as_token_ids": true})");
  EXPECT_TRUE(ids.tokens_as_ids);
  const char* chat = R"({"messages": [{"role": "user", "content": "hi"}], )";
  EXPECT_FALSE(parse_chat_request(std::string(chat) + R"("logprobs": false})").logprobs.has_value());
  EXPECT_EQ(parse_chat_request(std::string(chat) + R"("logprobs": true})").logprobs, 0);
  EXPECT_EQ(parse_chat_request(std::string(chat) + R"("logprobs": true, "top_logprobs": 5})").logprobs, 5);
}

TEST(Protocol, TokenizeAndDetokenize) {
  const TokenizeRequest plain = parse_tokenize_request(R"({"prompt": "Hi there", "model": "m"})");
  EXPECT_FALSE(plain.chat);
  EXPECT_EQ(plain.prompt, "Hi there");
  EXPECT_EQ(plain.model, "m");
  EXPECT_TRUE(plain.add_special_tokens);
  EXPECT_FALSE(parse_tokenize_request(R"({"prompt": "x", "add_special_tokens": false})").add_special_tokens);
  const TokenizeRequest chat =
      parse_tokenize_request(R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false})");
  EXPECT_TRUE(chat.chat);
  EXPECT_EQ(chat.messages.size(), 1u);
  EXPECT_FALSE(chat.add_special_tokens);  // the template writes its own
  EXPECT_FALSE(chat.add_generation_prompt);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [1, 2, 3]})").tokens, (std::vector<int32_t>{1, 2, 3}));
  auto param = [](std::function<void()> f) -> std::string {
    try {
      f();
    } catch (const ApiError& e) {
      return e.param();
    }
    return "(accepted)";
  };
  EXPECT_EQ(param([] { parse_tokenize_request(R"({})"); }), "prompt");
  EXPECT_EQ(param([] { parse_tokenize_request(R"({"prompt": [1, 2]})"); }), "prompt");
  EXPECT_EQ(param([] { parse_tokenize_request(R"({"messages": []})"); }), "messages");
  EXPECT_EQ(param([] { parse_tokenize_request(R"({"prompt": "x", "add_special_tokens": 1})"); }), "add_special_tokens");
  EXPECT_EQ(param([] { parse_detokenize_request(R"({"tokens": "1 2"})"); }), "tokens");
  EXPECT_EQ(param([] { parse_detokenize_request(R"({"tokens": [1, -2]})"); }), "tokens");
  EXPECT_EQ(param([] { parse_detokenize_request(R"({"tokens": [1], "model": 3})"); }), "model");
}

TEST(Protocol, ErrorBodyShape) {
  const std::string body = error_body(400, "temperature must be in [0, 2]", "temperature");
  EXPECT_EQ(body,
            R"({"error":{"message":"temperature must be in [0, 2]","type":"invalid_request_error",)"
            R"("param":"temperature","code":400}})");
  EXPECT_NE(error_body(401, "no key").find("\"authentication_error\""), std::string::npos);
  EXPECT_NE(error_body(400, "bad \xff byte").find("\xEF\xBF\xBD"),
            std::string::npos);  // never throws
}

}  // namespace
}  // namespace nibble
