// The PCRE2 regex layer against Oniguruma behaviour observed through the Python `tokenizers`
// library (Split pre-tokenizer): Unicode `\s` takes U+0085 but not U+180E, `\w` takes every
// number, `\h` is a hex digit, case-insensitive "'s" matches "'ſ", `^` anchors at every line.
#include <gtest/gtest.h>

#include "tokenizer/regex.h"

namespace nibble::tok {
namespace {

// The matched substrings.
std::vector<std::string> matches(std::string_view pattern, std::string_view text) {
  std::vector<std::string> out;
  for (const MatchSpan& span : Regex::from_oniguruma(pattern).find_matches(text)) {
    if (span.is_match) out.emplace_back(text.substr(span.start, span.end - span.start));
  }
  return out;
}

using Strings = std::vector<std::string>;

TEST(TokenizerRegex, WhitespaceClassIsOniguruma) {
  EXPECT_EQ(matches("\\s+", "a\u0085b\u180Ec\u00A0d\u3000e\u2028f\u200Bg"),
            (Strings{"\u0085", "\u00A0", "\u3000", "\u2028"}));
  EXPECT_EQ(matches("[^\\s]+", "a b\u0085c"), (Strings{"a", "b", "c"}));
}

TEST(TokenizerRegex, WordAndHexClassesAreOniguruma) {
  EXPECT_EQ(matches("\\w+", "a\u00BDb\u0301c_d\u203Fe-f\u0663g"),
            (Strings{"a\u00BDb\u0301c_d\u203Fe", "f\u0663g"}));
  EXPECT_EQ(matches("\\h+", "agz 0F"), (Strings{"a", "0F"}));
}

TEST(TokenizerRegex, CaseInsensitiveContractionsAndLineAnchors) {
  EXPECT_EQ(matches("(?i:'s|'t)", "it'S it'\u017F it'T"), (Strings{"'S", "'\u017F", "'T"}));
  EXPECT_EQ(matches("^a", "a\na"), (Strings{"a", "a"}));
  EXPECT_EQ(matches("a$", "a\na\n"), (Strings{"a", "a"}));
}

TEST(TokenizerRegex, SpansCoverTheText) {
  const auto spans = Regex::from_oniguruma("x*").find_matches("abc");
  std::size_t covered = 0;
  for (const MatchSpan& span : spans) {
    EXPECT_EQ(span.start, covered);
    covered = span.end;
  }
  EXPECT_EQ(covered, 3u);
  const auto empty = Regex::from_oniguruma("a").find_matches("");
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_FALSE(empty[0].is_match);
}

TEST(TokenizerRegex, LiteralsAreEscaped) {
  EXPECT_EQ(matches("", ""), Strings{});
  const auto spans = Regex::from_literal("a.b(").find_matches("axb(a.b(");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[1].start, 4u);
  EXPECT_TRUE(spans[1].is_match);
}

}  // namespace
}  // namespace nibble::tok
