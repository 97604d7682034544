// PCRE2-backed Regex with Oniguruma-compatible translation and match iteration (see regex.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <cctype>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace nibble::tok {
namespace {

// Oniguruma's Unicode `\s`: U+0009..U+000D, U+0085 and the Z categories. PCRE2's UCP `\s` also
// takes U+180E, so the class is spelled out.
constexpr std::string_view kSpaceSet = "\\t-\\r\\x{85}\\p{Z}";
// Oniguruma's Unicode `\w` (it takes every number, e.g. U+00BD, unlike PCRE2's).
constexpr std::string_view kWordSet = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
// Oniguruma's `\h` is a hex digit, not horizontal space as in PCRE2.
constexpr std::string_view kHexSet = "0-9a-fA-F";

struct EscapeSet {
  std::string_view set;  // empty: the escape means the same in both engines
  bool negated = false;
};

// The character set an Oniguruma escape letter stands for where PCRE2 reads it differently.
EscapeSet oniguruma_set(char letter) {
  switch (letter) {
    case 's':
      return {kSpaceSet, false};
    case 'S':
      return {kSpaceSet, true};
    case 'w':
      return {kWordSet, false};
    case 'W':
      return {kWordSet, true};
    case 'h':
      return {kHexSet, false};
    case 'H':
      return {kHexSet, true};
    default:
      return {};
  }
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return std::string(reinterpret_cast<const char*>(buffer));
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

std::string translate_oniguruma(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  std::size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      const auto [set, negated] = oniguruma_set(e);
      if (!set.empty() && !in_class) {
        out += negated ? "[^" : "[";
        out += set;
        out += ']';
      } else if (!set.empty() && !negated) {
        out += set;
      } else {
        // Everything else (and negated sets inside a class, which PCRE2 cannot subtract) is
        // passed through; copy the whole escaped character so `\[` never opens a class.
        const std::size_t n = utf8::char_len(static_cast<unsigned char>(e));
        out.append(pattern.substr(i, 1 + n));
        i += 1 + n;
        continue;
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < pattern.size() && pattern[i] == '^') out += pattern[i++];
      if (i < pattern.size() && pattern[i] == ']') out += pattern[i++];  // literal first ']'
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

Regex Regex::from_oniguruma(std::string_view pattern) {
  const std::string translated = translate_oniguruma(pattern);
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // Oniguruma's default syntax makes ^ and $ line anchors, hence MULTILINE.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &error_offset, context);
  pcre2_compile_context_free(context);
  if (code == nullptr) {
    fail("cannot compile regex \"", pattern, "\": ", pcre2_message(error), " (at offset ",
         error_offset, " of \"", translated, "\")");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT matching still works, slower
  auto holder = std::make_shared<Code>();
  holder->code = code;
  return Regex(std::move(holder));
}

Regex Regex::from_literal(std::string_view text) {
  std::string escaped;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) escaped += '\\';
    escaped += c;
  }
  return from_oniguruma(escaped);
}

std::vector<MatchSpan> Regex::find_matches(std::string_view text) const {
  std::vector<MatchSpan> spans;
  if (text.empty()) {
    spans.push_back({0, 0, false});
    return spans;
  }
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t prev = 0;                           // end of the last span pushed
  std::size_t search = 0;                         // where the next search starts
  std::size_t last_end = std::string_view::npos;  // end of the last accepted match
  while (search <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), search, PCRE2_NO_UTF_CHECK, data.get(),
                         nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_->code, subject, text.size(), search, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       data.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("regex match failed: ", pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const std::size_t start = ovector[0];
    const std::size_t end = ovector[1];
    if (start == end) {
      // As the onig crate: an empty match right where the previous match ended is dropped, and
      // the search moves on by one character.
      const bool accept = end != last_end;
      if (accept) {
        if (start != prev) spans.push_back({prev, start, false});
        spans.push_back({start, end, true});
        prev = end;
        last_end = end;
      }
      if (end >= text.size()) break;
      search = end + utf8::char_len(static_cast<unsigned char>(text[end]));
      continue;
    }
    if (start != prev) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = end;
    last_end = end;
    search = end;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  return spans;
}

}  // namespace nibble::tok
