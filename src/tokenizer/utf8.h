// UTF-8 and Unicode-property helpers shared by the tokenizer's pieces. Internal to src/tokenizer.
// Lossy decoding follows Rust's String::from_utf8_lossy (one U+FFFD per maximal invalid subpart),
// because that is what the `tokenizers` decoders do and decode() must match them byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace nibble::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Byte length of the first character of `s` if it is valid UTF-8, else 0 (invalid or incomplete).
std::size_t valid_prefix_len(std::string_view s);

// Byte offset of the first invalid byte, or nullopt when all of `s` is valid UTF-8.
std::optional<std::size_t> first_invalid(std::string_view s);

// Valid UTF-8 copy of `bytes`: each maximal invalid subpart becomes one U+FFFD.
std::string to_valid_lossy(std::string_view bytes);

// Decodes the character at `s[pos]` (which must be valid UTF-8) and advances `pos` past it.
char32_t next_char(std::string_view s, std::size_t& pos);
// Byte length of the character starting with lead byte `lead` (valid UTF-8 assumed).
inline std::size_t char_len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
// The last character of non-empty valid UTF-8 `s`, and where it starts.
char32_t last_char(std::string_view s, std::size_t* start = nullptr);
void append(std::string& out, char32_t c);

// Unicode White_Space (Rust's char::is_whitespace; regex `\s` in Rust's regex crate).
bool is_whitespace(char32_t c);
// Rust regex crate's Unicode `\w`: Alphabetic, marks, decimal digits, connector punctuation and
// join controls. Used by added tokens' `single_word`.
bool is_word_char(char32_t c);

}  // namespace nibble::utf8
