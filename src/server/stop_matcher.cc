// Stop-string matching over a held-back tail; the tail is never longer than the longest stop
// string.
#include "server/stop_matcher.h"

#include <algorithm>

namespace nibble {
namespace {

// The length of the longest suffix of `text` that is a proper prefix of `stop`.
std::size_t partial_match(std::string_view text, std::string_view stop) {
  for (std::size_t n = std::min(text.size(), stop.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == stop.substr(0, n)) return n;
  return 0;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
  if (state_ == StopState::kStopped) return {};
  held_ += text;
  // The earliest complete match wins, whichever stop string it is.
  std::size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    state_ = StopState::kStopped;
    Result r{held_.substr(0, first), StopState::kStopped};
    held_.clear();
    return r;
  }
  std::size_t keep = 0;
  for (const std::string& stop : stops_) keep = std::max(keep, partial_match(held_, stop));
  Result r{held_.substr(0, held_.size() - keep), StopState::kOpen};
  held_.erase(0, held_.size() - keep);
  return r;
}

std::string StopMatcher::flush() {
  if (state_ == StopState::kStopped) return {};
  std::string rest = std::move(held_);
  held_.clear();
  return rest;
}

}  // namespace nibble
