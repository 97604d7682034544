// StopMatcher: finds stop strings in text that arrives in pieces. It releases text as soon as it
// can no longer be part of a stop string, holds back any tail that may be the start of one, and on
// a match releases only the text before it (the stop string itself is excluded, as in OpenAI's
// API).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nibble {

enum class StopState : uint8_t { kOpen, kStopped };

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;  // safe to send now
    StopState state = StopState::kOpen;
  };
  // Appends `text`; once stopped, further text is ignored.
  Result push(std::string_view text);
  // The end of the output: whatever was held back (a stop string that never completed).
  std::string flush();
  StopState state() const { return state_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet released: a possible start of a stop string
  StopState state_ = StopState::kOpen;
};

}  // namespace nibble
