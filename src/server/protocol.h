// The OpenAI request bodies nibble accepts: POST /v1/completions and /v1/chat/completions, parsed
// and validated into one GenerationRequest. Unknown fields are ignored; a known field of the wrong
// type or out of range is an ApiError (400) naming it. Tokenizing and context checks come later
// (server/prepare.h): this file knows nothing of the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"

namespace nibble {

enum class Endpoint : uint8_t { kCompletion, kChat };

inline constexpr int64_t kMaxChoices = 128;  // OpenAI's limit on n

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletion;
  std::string model;  // empty when the client sent none
  // Completions: the prompt as text, or as token ids (prompt_is_ids).
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  // Chat: [{"role": ..., "content": "..."}], contents flattened to strings.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();

  std::optional<int64_t> max_tokens;  // unset: the endpoint's default
  SamplingParams sampling;            // its seed is only meaningful when `seed` is set
  std::optional<uint64_t> seed;       // unset: a fresh random seed per request
  std::vector<std::string> stop;      // matched on the output text, excluded from it
  std::vector<int64_t> stop_token_ids;  // vLLM's extension: finish (stop) on one; its text is not shown
  int64_t min_tokens = 0;               // vLLM's: no stop token or string before this many tokens
  bool ignore_eos = false;            // nibble extension (as vLLM and SGLang)
  // Each generated token's log-probability and the top k's (completions: logprobs = k; chat: logprobs
  // true, top_logprobs = k), k <= kMaxLogprobs; tokens shown as "token_id:N" with vLLM's
  // return_tokens_as_token_ids.
  std::optional<int32_t> logprobs;
  bool tokens_as_ids = false;
  int64_t n = 1;  // choices, each its own generation
  bool echo = false;  // completions: each choice's text (and logprobs) begin with the prompt's
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Both parse a request body; throw ApiError (400) for invalid JSON or invalid fields.
GenerationRequest parse_completion_request(std::string_view body);
GenerationRequest parse_chat_request(std::string_view body);

// POST /tokenize (vLLM's): a prompt, or chat messages as the chat template renders them.
struct TokenizeRequest {
  std::string model;
  bool chat = false;  // messages rather than a prompt
  std::string prompt;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_special_tokens = true;     // default: true for a prompt, false for messages (the template's own)
  bool add_generation_prompt = true;  // messages: end with the assistant turn's header
};
TokenizeRequest parse_tokenize_request(std::string_view body);

// POST /detokenize (vLLM's): token ids back to text.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize_request(std::string_view body);

}  // namespace nibble
