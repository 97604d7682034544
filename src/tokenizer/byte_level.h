// GPT-2's byte-level alphabet: every byte maps to one printable Unicode character so that BPE over
// characters can spell any byte sequence. Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
// themselves; the other 68 take U+0100.. in byte order.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace nibble::tok {

// Appends the byte-level spelling of `bytes` to `out`.
void byte_level_encode(std::string_view bytes, std::string& out);

// The byte a byte-level character stands for, if it is one.
std::optional<unsigned char> byte_level_byte(char32_t c);

// Decodes a byte-level token: all its characters must be byte-level ones (else nullopt).
std::optional<std::string> byte_level_decode(std::string_view token);

}  // namespace nibble::tok
