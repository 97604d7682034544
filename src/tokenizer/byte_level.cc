// Tables for the GPT-2 byte <-> character mapping (see byte_level.h).
#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace nibble::tok {
namespace {

constexpr char32_t kFirstShifted = 0x100;
constexpr char32_t kLastShifted = kFirstShifted + 68;  // one past

bool stands_for_itself(unsigned b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<std::string, 256> spelling;  // byte -> UTF-8 of its character
  std::array<int, kLastShifted> byte_of;  // character -> byte, or -1
  Tables() {
    byte_of.fill(-1);
    char32_t next = kFirstShifted;
    for (unsigned b = 0; b < 256; ++b) {
      const char32_t c = stands_for_itself(b) ? static_cast<char32_t>(b) : next++;
      utf8::append(spelling[b], c);
      byte_of[c] = static_cast<int>(b);
    }
  }
};

const Tables& tables() {
  static const Tables kTables;
  return kTables;
}

}  // namespace

void byte_level_encode(std::string_view bytes, std::string& out) {
  const Tables& t = tables();
  for (const char b : bytes) out += t.spelling[static_cast<unsigned char>(b)];
}

std::optional<unsigned char> byte_level_byte(char32_t c) {
  if (c >= kLastShifted) return std::nullopt;
  const int b = tables().byte_of[c];
  if (b < 0) return std::nullopt;
  return static_cast<unsigned char>(b);
}

std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  std::size_t pos = 0;
  while (pos < token.size()) {
    const auto b = byte_level_byte(utf8::next_char(token, pos));
    if (!b) return std::nullopt;
    bytes += static_cast<char>(*b);
  }
  return bytes;
}

}  // namespace nibble::tok
