// Python str semantics over UTF-8 for the Jinja engine (see jinja_pystr.h).
#include "tokenizer/jinja_pystr.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja_value.h"
#include "tokenizer/utf8.h"

namespace nibble::jinja {
namespace {

bool in_set(char32_t c, const std::u32string& set) {
  return set.find(c) != std::u32string::npos;
}

// Full Unicode case mapping of a whole string through ICU (UTF-16 in between).
enum class CaseMap : uint8_t { kUpper, kLower };
std::string map_case(std::string_view s, CaseMap mapping) {
  if (s.empty()) return {};
  UErrorCode status = U_ZERO_ERROR;
  int32_t length16 = 0;
  u_strFromUTF8(nullptr, 0, &length16, s.data(), static_cast<int32_t>(s.size()), &status);
  std::u16string in(static_cast<size_t>(length16), u'\0');
  status = U_ZERO_ERROR;
  u_strFromUTF8(in.data(), length16, nullptr, s.data(), static_cast<int32_t>(s.size()), &status);
  check(U_SUCCESS(status), "case mapping: invalid UTF-8");
  std::u16string out(in.size() * 3 + 4, u'\0');
  status = U_ZERO_ERROR;
  const int32_t out_length = mapping == CaseMap::kUpper
                                 ? u_strToUpper(out.data(), static_cast<int32_t>(out.size()),
                                                in.data(), length16, "", &status)
                                 : u_strToLower(out.data(), static_cast<int32_t>(out.size()),
                                                in.data(), length16, "", &status);
  check(U_SUCCESS(status), "case mapping failed");
  std::string result(static_cast<size_t>(out_length) * 3, '\0');
  int32_t length8 = 0;
  status = U_ZERO_ERROR;
  u_strToUTF8(result.data(), static_cast<int32_t>(result.size()), &length8, out.data(), out_length,
              &status);
  check(U_SUCCESS(status), "case mapping failed");
  result.resize(static_cast<size_t>(length8));
  return result;
}

bool is_cased(char32_t c) {
  const auto type = u_charType(static_cast<UChar32>(c));
  return type == U_UPPERCASE_LETTER || type == U_LOWERCASE_LETTER || type == U_TITLECASE_LETTER;
}

std::string title_char(char32_t c) {
  std::string out;
  utf8::append(out, static_cast<char32_t>(u_totitle(static_cast<UChar32>(c))));
  return out;
}

std::string one_char(char32_t c) {
  std::string out;
  utf8::append(out, c);
  return out;
}

}  // namespace

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) out.push_back(utf8::next_char(s, pos));
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char32_t c : s) utf8::append(out, c);
  return out;
}

int64_t code_point_count(std::string_view s) {
  int64_t count = 0;
  for (const char c : s) count += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return count;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, StripSide side) {
  const std::u32string text = decode(s);
  const std::u32string set = chars ? decode(*chars) : std::u32string();
  const auto strippable = [&](char32_t c) { return chars ? in_set(c, set) : is_space(c); };
  size_t begin = 0;
  size_t end = text.size();
  if (side != StripSide::kRight) {
    while (begin < end && strippable(text[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strippable(text[end - 1])) --end;
  }
  return encode(std::u32string_view(text).substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t max_split, StripSide from) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) raise("empty separator");
    if (from == StripSide::kRight) {
      size_t end = s.size();
      while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
        if (end < sep->size()) break;
        const size_t found = s.rfind(*sep, end - sep->size());
        if (found == std::string_view::npos) break;
        parts.emplace_back(s.substr(found + sep->size(), end - found - sep->size()));
        end = found;
      }
      parts.emplace_back(s.substr(0, end));
      return {parts.rbegin(), parts.rend()};
    }
    size_t begin = 0;
    while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
      const size_t found = s.find(*sep, begin);
      if (found == std::string_view::npos) break;
      parts.emplace_back(s.substr(begin, found - begin));
      begin = found + sep->size();
    }
    parts.emplace_back(s.substr(begin));
    return parts;
  }
  // Whitespace runs separate words; ends are dropped, and so is the whitespace next to the
  // unsplit remainder once max_split words are taken.
  std::u32string text = decode(s);
  if (from == StripSide::kRight) text.assign(text.rbegin(), text.rend());
  size_t pos = 0;
  while (true) {
    while (pos < text.size() && is_space(text[pos])) ++pos;
    if (pos == text.size()) break;
    if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
      parts.push_back(encode(std::u32string_view(text).substr(pos)));
      break;
    }
    const size_t start = pos;
    while (pos < text.size() && !is_space(text[pos])) ++pos;
    parts.push_back(encode(std::u32string_view(text).substr(start, pos - start)));
  }
  if (from == StripSide::kRight) {
    for (auto& part : parts) {
      const std::u32string chars = decode(part);
      part = encode(std::u32string(chars.rbegin(), chars.rend()));
    }
    return {parts.rbegin(), parts.rend()};
  }
  return parts;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
  std::string out;
  int64_t done = 0;
  const auto more = [&] { return count < 0 || done < count; };
  if (old.empty()) {  // inserts `with` around every character
    size_t pos = 0;
    while (pos <= s.size()) {
      if (more()) {
        out += with;
        ++done;
      }
      if (pos == s.size()) break;
      const size_t len = utf8::char_len(static_cast<unsigned char>(s[pos]));
      out += s.substr(pos, len);
      pos += len;
    }
    return out;
  }
  size_t begin = 0;
  while (more()) {
    const size_t found = s.find(old, begin);
    if (found == std::string_view::npos) break;
    out += s.substr(begin, found - begin);
    out += with;
    begin = found + old.size();
    ++done;
  }
  out += s.substr(begin);
  return out;
}

std::vector<std::string> split_lines(std::string_view s, bool keep_ends) {
  std::vector<std::string> lines;
  const std::u32string chars = decode(s);
  size_t start = 0;
  for (size_t i = 0; i < chars.size(); ++i) {
    const char32_t c = chars[i];
    const bool newline = c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1C ||
                         c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!newline) continue;
    size_t end = i + 1;
    if (c == '\r' && end < chars.size() && chars[end] == '\n') ++end;
    lines.push_back(
        encode(std::u32string_view(chars).substr(start, (keep_ends ? end : i) - start)));
    start = end;
    i = end - 1;
  }
  if (start < chars.size()) lines.push_back(encode(std::u32string_view(chars).substr(start)));
  return lines;
}

std::string upper(std::string_view s) {
  return map_case(s, CaseMap::kUpper);
}
std::string lower(std::string_view s) {
  return map_case(s, CaseMap::kLower);
}

std::string capitalize(std::string_view s) {
  if (s.empty()) return {};
  size_t pos = 0;
  const char32_t first = utf8::next_char(s, pos);
  return title_char(first) + lower(s.substr(pos));
}

std::string title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (const char32_t c : decode(s)) {
    out += previous_cased ? lower(one_char(c)) : title_char(c);
    previous_cased = is_cased(c);
  }
  return out;
}

bool is_lower(std::string_view s) {
  bool cased = false;
  for (const char32_t c : decode(s)) {
    if (u_isupper(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c))) return false;
    cased = cased || u_islower(static_cast<UChar32>(c));
  }
  return cased;
}

bool is_upper(std::string_view s) {
  bool cased = false;
  for (const char32_t c : decode(s)) {
    if (u_islower(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c))) return false;
    cased = cased || u_isupper(static_cast<UChar32>(c));
  }
  return cased;
}

std::vector<int64_t> slice_indexes(int64_t length, std::optional<int64_t> start,
                                   std::optional<int64_t> stop, std::optional<int64_t> step) {
  const int64_t stride = step.value_or(1);
  if (stride == 0) raise("slice step cannot be zero");
  const auto adjust = [&](std::optional<int64_t> index, int64_t fallback) {
    if (!index) return fallback;
    int64_t i = *index;
    if (i < 0) {
      i += length;
      if (i < 0) i = stride < 0 ? -1 : 0;
    } else if (i >= length) {
      i = stride < 0 ? length - 1 : length;
    }
    return i;
  };
  const int64_t first = adjust(start, stride < 0 ? length - 1 : 0);
  const int64_t last = adjust(stop, stride < 0 ? -1 : length);
  std::vector<int64_t> indexes;
  for (int64_t i = first; stride > 0 ? i < last : i > last; i += stride) indexes.push_back(i);
  return indexes;
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: positional for 1e-4 <= |x| < 1e16.
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  const std::string text(buffer, result.ptr);
  const size_t e = text.find('e');
  std::string mantissa = text.substr(0, e);
  const int exponent = std::stoi(text.substr(e + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits = mantissa.substr(0, 1) + (mantissa.size() > 2 ? mantissa.substr(2) : "");
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0)
      return sign + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    const size_t point = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= point)
      return sign + digits + std::string(point - digits.size(), '0') + ".0";
    return sign + digits.substr(0, point) + "." + digits.substr(point);
  }
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return sign + digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") + exp_text;
}

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == U'\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == U'\n') {
      out += "\\n";
    } else if (c == U'\r') {
      out += "\\r";
    } else if (c == U'\t') {
      out += "\\t";
    } else {
      const auto type = u_charType(static_cast<UChar32>(c));
      const bool printable =
          c == U' ' || (c >= 0x20 && c < 0x7F) ||
          (c >= 0x7F && type != U_CONTROL_CHAR && type != U_FORMAT_CHAR && type != U_SURROGATE &&
           type != U_PRIVATE_USE_CHAR && type != U_UNASSIGNED && type != U_LINE_SEPARATOR &&
           type != U_PARAGRAPH_SEPARATOR && type != U_SPACE_SEPARATOR);
      if (printable) {
        utf8::append(out, c);
      } else {
        char escape[16];
        const unsigned code = static_cast<unsigned>(c);
        if (code < 0x100) {
          std::snprintf(escape, sizeof(escape), "\\x%02x", code);
        } else if (code < 0x10000) {
          std::snprintf(escape, sizeof(escape), "\\u%04x", code);
        } else {
          std::snprintf(escape, sizeof(escape), "\\U%08x", code);
        }
        out += escape;
      }
    }
  }
  out += quote;
  return out;
}

}  // namespace nibble::jinja
