// The JSON nibble answers with, in OpenAI's shapes: a whole text_completion / chat.completion, the
// chunks of a streamed one (text_completion / chat.completion.chunk) as Server-Sent Events, and the
// model list. Strings are dumped with invalid UTF-8 replaced, so a response can never fail to
// encode.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/protocol.h"

namespace nibble {

struct ResponseMeta {
  Endpoint endpoint;
  std::string id;   // "cmpl-…" or "chatcmpl-…"
  int64_t created;  // Unix seconds
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// A generated token's log-probability as a response shows it: the token's text (or "token_id:N"), its
// most likely alternatives', and (completions) where its text starts among the tokens' texts so far.
struct ShownLogprob {
  std::string token;
  std::optional<float> logprob;  // none for an echoed prompt's first token (null, its top too)
  std::vector<std::pair<std::string, float>> top;
  int64_t text_offset = 0;  // characters
};
using ShownLogprobs = std::vector<ShownLogprob>;

// A fresh id and the current time for a response of `endpoint`.
ResponseMeta new_response_meta(Endpoint endpoint, const std::string& model);

// One choice of a whole response (the request's n choices are numbered by their order).
struct ChoiceResult {
  std::string text;
  std::string finish_reason;
  const ShownLogprobs* logprobs = nullptr;  // null: "logprobs": null
};
std::string full_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices, const Usage& usage);

// Stream events, each "data: {...}\n\n". With include_usage every chunk carries "usage": null and
// the usage event (empty choices) comes last before [DONE], as OpenAI does.
enum class UsageField : uint8_t { kAbsent, kNull };
// Each for choice `index` of the request's n.
std::string role_event(const ResponseMeta& meta, int index, UsageField usage);  // chat only: the assistant role
std::string text_event(const ResponseMeta& meta, int index, const std::string& text, UsageField usage,
                       const ShownLogprobs* logprobs = nullptr);
std::string finish_event(const ResponseMeta& meta, int index, const std::string& finish_reason, UsageField usage);
std::string usage_event(const ResponseMeta& meta, const Usage& usage);
std::string error_event(int status, const std::string& message);
inline constexpr char kDoneEvent[] = "data: [DONE]\n\n";

std::string models_response(const std::string& model, int64_t created, int64_t context_length);
// vLLM's /tokenize and /detokenize answers.
std::string tokenize_response(const std::vector<int32_t>& tokens, int64_t context_length);
std::string detokenize_response(const std::string& text);

}  // namespace nibble
