// A JSON value quoted in a one-line error message: printable (format/quote.h), and at most 60
// characters plus "..." however large the value is.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "format/quote.h"

namespace nibble {

inline std::string json_brief(const nlohmann::json& value) {
  constexpr std::size_t kMaxChars = 60;
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return printable(text);
}

}  // namespace nibble
