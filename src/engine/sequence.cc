// Sequence construction and names.
#include "engine/sequence.h"

#include "core/error.h"

namespace nibble {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNone: return "";
  }
  return "";
}

Sequence::Sequence(int64_t id, std::vector<int32_t> prompt, RequestParams params)
    : sampler(params.sampling),
      id_(id),
      tokens_(std::move(prompt)),
      num_prompt_tokens_(static_cast<int64_t>(tokens_.size())),
      params_(std::move(params)) {
  check(!tokens_.empty(), "a request needs at least one prompt token");
  check(params_.max_tokens >= 1, "max_tokens must be at least 1, got ", params_.max_tokens);
  check(params_.min_tokens >= 0 && params_.min_tokens <= params_.max_tokens, "min_tokens must be in [0, max_tokens = ",
        params_.max_tokens, "], got ", params_.min_tokens);
}

void Sequence::append(int32_t token) {
  tokens_.push_back(token);
  if (params_.sampling.penalties.any()) ++generated_counts_[token];
}

bool Sequence::adjusts_logits() const {
  const SamplingParams& p = params_.sampling;
  return p.penalties.any() || !p.logit_bias.empty() || num_generated() < params_.min_tokens;
}

std::vector<SeenToken> Sequence::seen_tokens() const {
  std::map<int32_t, SeenToken> seen;
  for (const auto& [token, count] : generated_counts_) seen[token] = {token, count};
  if (params_.sampling.penalties.repetition != 1.0f)
    for (int64_t i = 0; i < num_prompt_tokens_; ++i) {
      const int32_t token = tokens_[static_cast<std::size_t>(i)];
      seen.try_emplace(token, SeenToken{token, 0});
    }
  // A biased token the sequence has not seen takes no penalty (kNotSeen), only its bias.
  for (const auto& [token, bias] : params_.sampling.logit_bias)
    seen.try_emplace(token, SeenToken{token, kNotSeen}).first->second.bias = bias;
  if (num_generated() < params_.min_tokens)
    for (int64_t id : params_.stop_token_ids) seen[static_cast<int32_t>(id)] = {static_cast<int32_t>(id), kBanned};
  std::vector<SeenToken> out;
  out.reserve(seen.size());
  for (const auto& [token, t] : seen) out.push_back(t);
  return out;
}

}  // namespace nibble
