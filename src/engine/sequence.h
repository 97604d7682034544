// Sequence: one request's tokens and state as the engine schedules it. Its KV lives in the blocks of
// `block_table`; the first `num_computed_tokens` tokens have KV in the cache.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/token_logprobs.h"

namespace nibble {

enum class SequenceStatus : uint8_t { kWaiting, kRunning, kFinished };
enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort };

const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort"

struct RequestParams {
  SamplingParams sampling;
  int64_t max_tokens = 16;           // new tokens to generate at most
  std::vector<int64_t> stop_token_ids;  // finish (reason stop) when one is sampled
  bool ignore_eos = false;
  int32_t logprobs = -1;  // -1: none; k >= 0: each sampled token's log-probability and the top k's
  int64_t min_tokens = 0;  // the stop tokens cannot be sampled before this many tokens are generated
  // -1: none; k >= 0: the log-probability of each prompt token after the first given those before it,
  // and the top k's (the prompt is then computed whole, sharing no cached prefix)
  int32_t prompt_logprobs = -1;
};

class Sequence {
 public:
  Sequence(int64_t id, std::vector<int32_t> prompt, RequestParams params);

  int64_t id() const { return id_; }
  const RequestParams& params() const { return params_; }
  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;

  const std::vector<int32_t>& tokens() const { return tokens_; }  // prompt then generated
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int64_t num_generated() const { return num_tokens() - num_prompt_tokens_; }
  int32_t last_token() const { return tokens_.back(); }
  void append(int32_t token);
  // Whether this step changes any of the sequence's logits (penalties, logit_bias, min_tokens ahead).
  bool adjusts_logits() const;
  // The tokens whose logits this step changes, in increasing order: with penalties every distinct
  // token of the prompt and the output (the output's alone when the repetition penalty is 1) with how
  // often it was generated; the logit_bias tokens with their bias; before min_tokens, the stop tokens
  // as kBanned.
  std::vector<SeenToken> seen_tokens() const;

  std::vector<int32_t> block_table;  // KV block ids, in order
  int64_t num_computed_tokens = 0;   // tokens whose KV is in the cache
  Sampler sampler;                   // per sequence, so batching never changes a seeded sample
  std::optional<TokenLogprobs> last_logprobs;  // the last sampled token's, where params().logprobs >= 0
  // Where params().prompt_logprobs >= 0: entry p for prompt token p (none for the first), filled as
  // the prompt's chunks are computed, handed out once with the first sampled token.
  std::vector<std::optional<TokenLogprobs>> prompt_logprobs;
  bool prompt_logprobs_sent = false;

 private:
  int64_t id_;
  std::vector<int32_t> tokens_;
  int64_t num_prompt_tokens_;
  RequestParams params_;
  std::map<int32_t, int32_t> generated_counts_;  // with penalties: token -> times generated
};

}  // namespace nibble
