// Number and string literals inside Jinja tags, read with jinja2's rules: integers (with _
// separators, 0x/0o/0b), floats (a fraction or an exponent, not right after a '.'), and quoted
// strings unescaped like Python's "unicode-escape" (unknown escapes keep their backslash).
#include <cctype>
#include <cstdio>

#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_value.h"
#include "tokenizer/utf8.h"

namespace nibble::jinja {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// (\d+_)*\d+ at s[at]: appends the digits to `out`, returns the end.
size_t digits(std::string_view s, size_t at, std::string& out) {
  size_t i = at;
  while (i < s.size() &&
         (is_digit(s[i]) || (s[i] == '_' && i > at && i + 1 < s.size() && is_digit(s[i + 1])))) {
    if (s[i] != '_') out += s[i];
    ++i;
  }
  return i;
}

// The escape at s[at] == '\\': appends what it stands for, returns the index after it.
size_t unescape(std::string_view s, size_t at, std::string& out) {
  const char c = s[at + 1];
  const auto hex = [&](size_t count) {
    const std::string h(s.substr(at + 2, count));
    if (h.size() < count || h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      raise("truncated \\", c, " escape in string literal");
    }
    const unsigned long code = std::stoul(h, nullptr, 16);
    if (code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      raise("unsupported character escape in string literal");
    }
    utf8::append(out, static_cast<char32_t>(code));
    return at + 2 + count;
  };
  constexpr std::string_view kSimple = "\n\\'\"abfnrtv";
  constexpr char kMeaning[] = {'\0', '\\', '\'', '"', '\a', '\b', '\f', '\n', '\r', '\t', '\v'};
  if (const size_t k = kSimple.find(c); k != std::string_view::npos) {
    if (c != '\n') out += kMeaning[k];  // backslash-newline continues the line
    return at + 2;
  }
  if (c == 'x') return hex(2);
  if (c == 'u') return hex(4);
  if (c == 'U') return hex(8);
  if (c >= '0' && c <= '7') {
    size_t i = at + 1;
    unsigned code = 0;
    while (i < s.size() && i < at + 4 && s[i] >= '0' && s[i] <= '7') {
      code = code * 8 + static_cast<unsigned>(s[i] - '0');
      ++i;
    }
    utf8::append(out, static_cast<char32_t>(code));
    return i;
  }
  if (c == 'N') raise("\\N{...} escapes are not supported");
  out += '\\';
  if (static_cast<unsigned char>(c) >= 0x80) {
    // Jinja turns non-ASCII into \xhh/\uXXXX before unescaping, so "\é" reads as "\xe9".
    size_t next = at + 1;
    const char32_t code = utf8::next_char(s, next);
    char buffer[16];
    std::snprintf(buffer, sizeof(buffer),
                  code < 0x100     ? "x%02x"
                  : code < 0x10000 ? "u%04x"
                                   : "U%08x",
                  static_cast<unsigned>(code));
    out += buffer;
    return next;
  }
  return at + 1;  // unknown escape: the backslash stays, the character is read next
}

}  // namespace

std::optional<Literal> read_number(std::string_view s, size_t at) {
  if (at >= s.size() || !is_digit(s[at])) return std::nullopt;
  Literal literal{TokenKind::kInteger, "", 0};
  size_t i = digits(s, at, literal.text);
  const bool after_dot = at > 0 && s[at - 1] == '.';  // "x.0.1" is two subscripts
  if (!after_dot && i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
    literal.text += '.';
    i = digits(s, i + 1, literal.text);
    literal.kind = TokenKind::kFloat;
  }
  if (!after_dot && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    std::string exponent = "e";
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) exponent += s[j++];
    if (j < s.size() && is_digit(s[j])) {
      i = digits(s, j, exponent);
      literal.text += exponent;
      literal.kind = TokenKind::kFloat;
    }
  }
  if (literal.kind == TokenKind::kInteger && s[at] == '0' && at + 1 < s.size() &&
      std::string_view("xXoObB").find(s[at + 1]) != std::string_view::npos) {
    const char b = static_cast<char>(s[at + 1] | 0x20);
    std::string value;
    for (i = at + 2;
         i < s.size() && (std::isxdigit(static_cast<unsigned char>(s[i])) || s[i] == '_'); ++i) {
      if (s[i] != '_') value += s[i];
    }
    try {
      literal.text = std::to_string(std::stoll(value, nullptr, b == 'x' ? 16 : b == 'o' ? 8 : 2));
    } catch (const std::exception&) {
      raise("invalid integer literal");
    }
  }
  literal.end = i;
  return literal;
}

std::optional<Literal> read_string(std::string_view s, size_t at) {
  if (at >= s.size() || (s[at] != '\'' && s[at] != '"')) return std::nullopt;
  const char quote = s[at];
  Literal literal{TokenKind::kString, "", 0};
  size_t i = at + 1;
  while (true) {
    if (i >= s.size() || (s[i] == '\\' && i + 1 >= s.size())) raise("unterminated string literal");
    if (s[i] == quote) break;
    if (s[i] == '\\') {
      i = unescape(s, i, literal.text);
    } else {
      literal.text += s[i++];
    }
  }
  literal.end = i + 1;
  return literal;
}

}  // namespace nibble::jinja
