// Regular expressions for Split pre-tokenizers and Replace normalizers/decoders: PCRE2 (UTF, UCP,
// JIT when available) behind the matching rules of `tokenizers`, which uses Oniguruma. Patterns
// are translated where the two engines differ (`\s`, `\w`, `\h`, `^`/`$` per line) and iteration
// over matches treats empty matches the way the `onig` crate's find_iter does.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::tok {

// A span of the searched text; consecutive spans cover it entirely.
struct MatchSpan {
  std::size_t start = 0;
  std::size_t end = 0;
  bool is_match = false;
};

class Regex {
 public:
  // Throws nibble::Error with PCRE2's message (the caller adds where the pattern came from).
  static Regex from_oniguruma(std::string_view pattern);
  static Regex from_literal(std::string_view text);

  // tokenizers' Pattern::find_matches: alternating non-matches and matches covering `text`
  // (valid UTF-8); an empty `text` gives one empty non-match.
  std::vector<MatchSpan> find_matches(std::string_view text) const;

 private:
  struct Code;
  explicit Regex(std::shared_ptr<const Code> code) : code_(std::move(code)) {}
  std::shared_ptr<const Code> code_;
};

// Oniguruma -> PCRE2 pattern translation (exposed for tests).
std::string translate_oniguruma(std::string_view pattern);

}  // namespace nibble::tok
