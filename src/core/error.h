// nibble's one error type and the checks that raise it.
// Errors are exceptions carrying one human-readable line; the `nibble` command catches them at the
// top and prints that line. Hot paths (a decode step) never throw: only edges (parsers, loaders) do.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace nibble {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Concatenates anything streamable: cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

template <typename... Args>
void check(bool condition, Args&&... args) {
  if (!condition) fail(std::forward<Args>(args)...);
}

}  // namespace nibble
