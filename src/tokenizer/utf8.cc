// UTF-8 validation, lossy decoding and the two Unicode properties the tokenizer needs (ICU).
#include "tokenizer/utf8.h"

#include <unicode/uchar.h>

namespace nibble::utf8 {
namespace {

bool is_continuation(unsigned char b) {
  return (b & 0xC0) == 0x80;
}

// How many leading bytes of `s` form a valid prefix of some UTF-8 sequence (at least 1 for an
// invalid lead byte, so the caller always makes progress); `complete` tells if it is a whole one.
std::size_t scan_sequence(std::string_view s, bool& complete) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  complete = false;
  if (b0 < 0x80) {
    complete = true;
    return 1;
  }
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 1;
  }
  std::size_t i = 1;
  for (; i <= need; ++i) {
    if (i >= s.size()) return i;
    const auto b = static_cast<unsigned char>(s[i]);
    const bool ok = i == 1 ? (b >= lo && b <= hi) : is_continuation(b);
    if (!ok) return i;
  }
  complete = true;
  return i;
}

}  // namespace

std::size_t valid_prefix_len(std::string_view s) {
  if (s.empty()) return 0;
  bool complete = false;
  const std::size_t n = scan_sequence(s, complete);
  return complete ? n : 0;
}

std::optional<std::size_t> first_invalid(std::string_view s) {
  std::size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    bool complete = false;
    const std::size_t n = scan_sequence(s.substr(pos), complete);
    if (!complete) return pos;
    pos += n;
  }
  return std::nullopt;
}

std::string to_valid_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete = false;
    const std::size_t n = scan_sequence(bytes.substr(pos), complete);
    if (complete) {
      out.append(bytes.substr(pos, n));
    } else {
      out.append(kReplacement);
    }
    pos += n;
  }
  return out;
}

char32_t next_char(std::string_view s, std::size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  const std::size_t n = char_len(b0);
  char32_t c = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (std::size_t i = 1; i < n; ++i)
    c = (c << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  pos += n;
  return c;
}

char32_t last_char(std::string_view s, std::size_t* start) {
  std::size_t i = s.size() - 1;
  while (i > 0 && is_continuation(static_cast<unsigned char>(s[i]))) --i;
  if (start != nullptr) *start = i;
  std::size_t pos = i;
  return next_char(s, pos);
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool is_whitespace(char32_t c) {
  return u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool is_word_char(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  const auto mask = U_GET_GC_MASK(cp);
  return (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

}  // namespace nibble::utf8
