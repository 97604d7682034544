// The "pattern" of Split, Replace normalizers and Replace decoders: {"String": s} (a literal) or
// {"Regex": r} (Oniguruma syntax, run by PCRE2; see regex.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_context.h"
#include "tokenizer/regex.h"

namespace nibble::tok {

class Pattern {
 public:
  static Pattern literal(std::string text);
  static Pattern regex(std::string_view oniguruma);

  // Spans covering `text`, as Regex::find_matches.
  std::vector<MatchSpan> find_matches(std::string_view text) const;
  std::string replace_all(std::string_view text, std::string_view content) const;

 private:
  Pattern() = default;
  std::string literal_;  // used when regex_ is empty
  std::optional<Regex> regex_;
};

// Reads `json`["pattern"].
Pattern make_pattern(const Json& json, std::string_view where, const JsonContext& context);

}  // namespace nibble::tok
