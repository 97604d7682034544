// From a parsed OpenAI request to what the engine takes: the chat template applied, the prompt
// tokenized, and the limits checked against the model (context length, KV cache size, vocabulary),
// each violation an ApiError (400) naming the field. Runs on the handler's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/sequence.h"
#include "server/protocol.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

struct ModelLimits {
  int64_t context_length;  // max_position_embeddings
  int64_t kv_capacity;     // tokens the KV cache holds in all
  int64_t vocab_size;
};

struct PreparedRequest {
  std::vector<int32_t> prompt;
  RequestParams params;
};

constexpr int64_t kDefaultCompletionMaxTokens = 16;  // OpenAI's default for /v1/completions

// A fresh seed for a request that gave none.
uint64_t random_seed();

PreparedRequest prepare(const GenerationRequest& request, const Tokenizer& tokenizer,
                        const ChatTemplate& chat_template, const ModelLimits& limits);

// /tokenize: the prompt's ids, or the rendered messages' (400 where the template rejects them).
std::vector<int32_t> tokenize(const TokenizeRequest& request, const Tokenizer& tokenizer,
                              const ChatTemplate& chat_template);
// /detokenize: the ids' text, special tokens skipped (400 for an id outside the vocabulary).
std::string detokenize(const DetokenizeRequest& request, const Tokenizer& tokenizer, const ModelLimits& limits);

}  // namespace nibble
