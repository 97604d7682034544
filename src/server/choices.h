// Choices: the n generations of one request (OpenAI's `n`), polled together, with how their tokens'
// log-probabilities show. A request without `n` is one choice.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/generation.h"
#include "server/responses.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

// How a choice's tokens show in its logprobs: their text with special tokens (or "token_id:N"), and
// the character where each starts among those texts, counted on from `offset`.
struct LogprobsView {
  const Tokenizer* tokenizer = nullptr;  // null: the request asked for none
  bool as_ids = false;
  int64_t offset = 0;

  ShownLogprobs show(const std::vector<std::pair<int32_t, TokenLogprobs>>& entries);
  // An echoed prompt's tokens, entry p the log-probability of token p (none for the first).
  ShownLogprobs show_prompt(const std::vector<int32_t>& prompt, const std::vector<std::optional<TokenLogprobs>>& logprobs);

 private:
  std::string token_text(int32_t id) const;
};

// Completions' echo: each choice begins with the prompt's text (and its tokens' logprobs).
struct Echo {
  std::string text;
  std::vector<int32_t> prompt;
};

class Choices {
 public:
  Choices(std::vector<std::unique_ptr<Generation>> generations, const LogprobsView& logprobs,
          std::optional<Echo> echo = std::nullopt);

  struct Update {
    int index;
    std::string text;                       // possibly empty
    std::optional<ShownLogprobs> logprobs;  // where the request asked for them (possibly none new)
    bool finished;                          // the choice ended with this update
  };
  // Waits up to `timeout` for news (a few ms per choice when there are several); returns the news of
  // each choice that has some.
  std::vector<Update> poll(std::chrono::milliseconds timeout);

  int size() const { return static_cast<int>(generations_.size()); }
  bool done() const;
  const Generation& operator[](int i) const { return *generations_[static_cast<std::size_t>(i)]; }
  // The first error among the choices, if any.
  std::optional<StreamError> error() const;
  Usage usage() const;  // the prompt once, every choice's completion
  void abort();         // every choice still running (the client is gone)

 private:
  std::vector<std::unique_ptr<Generation>> generations_;
  std::vector<LogprobsView> views_;
  std::vector<bool> reported_;  // each choice's end has been returned by poll
  std::optional<Echo> echo_;
  std::vector<bool> echoed_;  // each choice's first update, which carries the echo, has gone out
};

}  // namespace nibble
