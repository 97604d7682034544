// Settings read from the environment: the experiment and tuning knobs the README lists (NIBBLE_*).
// Each is read once where it is used (a function-local static); a value outside its choices is an
// error that names them.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>

#include "core/error.h"

namespace nibble::cuda {

// NAME's value: one of `choices`, or empty where NAME is unset or empty.
inline std::string env_choice(const char* name, std::initializer_list<std::string_view> choices) {
  const char* v = std::getenv(name);
  const std::string value = v != nullptr ? v : "";
  if (value.empty()) return value;
  std::string listed;
  for (const std::string_view choice : choices) {
    if (value == choice) return value;
    listed += cat(listed.empty() ? "" : ", ", choice);
  }
  fail(name, " must be one of ", listed, ", not ", value);
}

// NAME=1: on; unset, empty or 0: off.
inline bool env_switch(const char* name) { return env_choice(name, {"0", "1"}) == "1"; }

}  // namespace nibble::cuda
