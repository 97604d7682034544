// Generation: one request in flight, as its handler sees it: the engine stream it waits on and the
// text that stream turns into. When a stop string matches it aborts the engine request at once; if
// it is dropped before the end (the client went away) it aborts too, so KV blocks always come back.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/async_engine.h"
#include "server/metrics.h"
#include "server/output_text.h"

namespace nibble {

class Generation {
 public:
  Generation(AsyncEngine& engine, Metrics& metrics, const Tokenizer& tokenizer,
             std::vector<int32_t> prompt, RequestParams params, std::vector<std::string> stop);
  ~Generation();  // abort() unless done
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Waits up to `timeout` for tokens; returns the new text (possibly empty).
  std::string advance(std::chrono::milliseconds timeout);
  // Gives up on the request (the client is gone); its KV blocks are freed.
  void abort();

  bool done() const { return done_; }
  const std::optional<StreamError>& error() const { return error_; }
  const std::string& finish_reason() const { return finish_reason_; }  // "stop", "length", "abort"
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return text_.num_tokens(); }
  // The log-probabilities of the tokens generated since the last call, with their ids (where the
  // request asked for them).
  std::vector<std::pair<int32_t, TokenLogprobs>> take_logprobs() { return std::exchange(logprobs_, {}); }
  // The prompt tokens' log-probabilities (RequestParams::prompt_logprobs), once they have come.
  std::vector<std::optional<TokenLogprobs>> take_prompt_logprobs() { return std::exchange(prompt_logprobs_, {}); }

 private:
  void finish(const std::string& reason);

  AsyncEngine& engine_;
  Metrics& metrics_;
  int64_t prompt_tokens_;
  OutputText text_;
  std::shared_ptr<RequestStream> stream_;
  bool done_ = false;
  std::optional<StreamError> error_;
  std::string finish_reason_;
  std::vector<std::pair<int32_t, TokenLogprobs>> logprobs_;
  std::vector<std::optional<TokenLogprobs>> prompt_logprobs_;
};

}  // namespace nibble
