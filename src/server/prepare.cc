// Prompt building and limit checks. Chat prompts are encoded without the post-processor: the
// template writes BOS itself where the model wants it (as vLLM and SGLang do).
#include "server/prepare.h"

#include <algorithm>
#include <mutex>
#include <random>

#include "server/api_error.h"

namespace nibble {
namespace {

std::string render_messages(const nlohmann::ordered_json& messages, GenerationPrompt generation_prompt,
                            const ChatTemplate& chat_template) {
  try {
    return chat_template.render(messages, generation_prompt);
  } catch (const Error& e) {
    reject(400, "messages", "the chat template rejected the messages: ", e.what());
  }
}

std::vector<int32_t> build_prompt(const GenerationRequest& r, const Tokenizer& tokenizer,
                                  const ChatTemplate& chat_template) {
  if (r.endpoint == Endpoint::kChat)
    return tokenizer.encode(render_messages(r.messages, GenerationPrompt::kAdd, chat_template), AddSpecialTokens::kNo);
  if (r.prompt_is_ids) return r.prompt_ids;
  return tokenizer.encode(r.prompt_text);
}

}  // namespace

uint64_t random_seed() {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lock(mutex);
  return rng();
}

PreparedRequest prepare(const GenerationRequest& r, const Tokenizer& tokenizer,
                        const ChatTemplate& chat_template, const ModelLimits& limits) {
  PreparedRequest out;
  out.prompt = build_prompt(r, tokenizer, chat_template);
  const char* prompt_field = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
  const auto prompt_len = static_cast<int64_t>(out.prompt.size());
  if (prompt_len == 0) reject(400, prompt_field, "the prompt is empty");
  for (int32_t id : out.prompt)
    if (id >= limits.vocab_size)
      reject(400, prompt_field, "token id ", id, " is outside the vocabulary of ",
             limits.vocab_size);

  const int64_t room = std::min(limits.context_length, limits.kv_capacity);
  if (prompt_len >= room)
    reject(400, prompt_field, "the prompt is too long: ", prompt_len, " tokens, and at most ",
           room - 1, " fit (context length ", limits.context_length, ", KV cache ",
           limits.kv_capacity, " tokens)");
  int64_t max_tokens =
      r.endpoint == Endpoint::kChat ? room - prompt_len : kDefaultCompletionMaxTokens;
  if (r.max_tokens)
    max_tokens = *r.max_tokens;
  else
    max_tokens = std::min(max_tokens, room - prompt_len);
  if (prompt_len + max_tokens > limits.context_length)
    reject(400, "max_tokens", "the prompt (", prompt_len, " tokens) plus max_tokens (", max_tokens,
           ") exceeds the model's context length of ", limits.context_length, " tokens");
  if (prompt_len + max_tokens > limits.kv_capacity)
    reject(400, "max_tokens", "the prompt (", prompt_len, " tokens) plus max_tokens (", max_tokens,
           ") exceeds the KV cache of ", limits.kv_capacity, " tokens");

  out.params.sampling = r.sampling;
  out.params.sampling.seed = r.seed ? *r.seed : random_seed();
  out.params.max_tokens = max_tokens;
  out.params.ignore_eos = r.ignore_eos;
  for (int64_t id : r.stop_token_ids)
    if (id >= limits.vocab_size)
      reject(400, "stop_token_ids", "token id ", id, " is outside the vocabulary of ", limits.vocab_size);
  out.params.stop_token_ids = r.stop_token_ids;
  for (const auto& [id, bias] : r.sampling.logit_bias)
    if (id >= limits.vocab_size)
      reject(400, "logit_bias", "token id ", id, " is outside the vocabulary of ", limits.vocab_size);
  out.params.logprobs = r.logprobs.value_or(-1);
  if (r.echo) out.params.prompt_logprobs = out.params.logprobs;  // the echoed prompt's too
  if (r.min_tokens > max_tokens)
    reject(400, "min_tokens", "min_tokens (", r.min_tokens, ") exceeds max_tokens (", max_tokens, ")");
  out.params.min_tokens = r.min_tokens;
  return out;
}

std::vector<int32_t> tokenize(const TokenizeRequest& r, const Tokenizer& tokenizer, const ChatTemplate& chat_template) {
  const AddSpecialTokens special = r.add_special_tokens ? AddSpecialTokens::kYes : AddSpecialTokens::kNo;
  if (!r.chat) return tokenizer.encode(r.prompt, special);
  const GenerationPrompt generation_prompt = r.add_generation_prompt ? GenerationPrompt::kAdd : GenerationPrompt::kOmit;
  return tokenizer.encode(render_messages(r.messages, generation_prompt, chat_template), special);
}

std::string detokenize(const DetokenizeRequest& r, const Tokenizer& tokenizer, const ModelLimits& limits) {
  for (int32_t id : r.tokens)
    if (id >= limits.vocab_size)
      reject(400, "tokens", "token id ", id, " is outside the vocabulary of ", limits.vocab_size);
  return tokenizer.decode(r.tokens);
}

}  // namespace nibble
