// OutputText: one request's generated tokens turned into the text a client sees, piece by piece:
// incremental detokenization (never half a UTF-8 character, special tokens skipped) followed by
// stop-string matching (text that may start a stop string is held back until it cannot).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

class OutputText {
 public:
  // Stop strings are looked for only in the text of tokens after the first min_tokens (as vLLM).
  OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop, int64_t min_tokens = 0);

  // The text `token` releases (possibly empty); after a stop string matched, nothing more.
  std::string push(int32_t token);
  // A token that counts (usage) but shows no text: a stop token.
  void count_hidden();
  // The generation ended (length or end-of-sequence): the rest of the text.
  std::string finish();

  bool stopped() const { return stop_.state() == StopState::kStopped; }
  int64_t num_tokens() const { return num_tokens_; }  // tokens pushed up to and including the stop

 private:
  IncrementalDecoder decoder_;
  StopMatcher stop_;
  int64_t num_tokens_ = 0;
  int64_t min_tokens_;
};

}  // namespace nibble
