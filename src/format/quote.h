// Makes untrusted text (tensor names, JSON library messages) safe to put in a one-line error:
// control characters and bytes that are not valid UTF-8 become \xNN escapes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace nibble {

// Length of the valid UTF-8 sequence starting at text[i], or 0 if there is none.
inline std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t length = 0;
  unsigned lo = 0x80,
           hi = 0xBF;  // allowed range of the second byte (excludes overlongs, surrogates)
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return length;
}

enum class QuoteMarks : bool { kKeep, kEscape };

inline std::string escape_text(std::string_view text, QuoteMarks quote_marks) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c == '"' || c == '\\') && quote_marks == QuoteMarks::kEscape) {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
      ++i;
    } else if (const std::size_t n = c >= 0x80 ? utf8_sequence_length(text, i) : 0; n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
      ++i;
    }
  }
  return out;
}

inline std::string printable(std::string_view text) {
  return escape_text(text, QuoteMarks::kKeep);
}

// "name" with its contents made printable (quotes and backslashes inside escaped as in JSON).
// Not called `quoted`: argument-dependent lookup would pick std::quoted for a std::string.
inline std::string quote_text(std::string_view text) {
  return "\"" + escape_text(text, QuoteMarks::kEscape) + "\"";
}

}  // namespace nibble
