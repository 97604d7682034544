// Python str semantics over UTF-8 std::strings, for the Jinja engine: lengths, indexes and slices
// count code points, whitespace is str.isspace(), case mapping is Unicode's (through ICU), floats
// print as repr() does. Inputs are valid UTF-8 (the template and its inputs are checked on entry).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::jinja {

std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
int64_t code_point_count(std::string_view s);
bool is_space(char32_t c);  // str.isspace()

enum class StripSide : uint8_t { kLeft, kRight, kBoth };
// str.strip/lstrip/rstrip; `chars` absent strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, StripSide side);
// str.split/rsplit; `sep` absent splits on whitespace runs. max_split < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t max_split, StripSide from = StripSide::kLeft);
// str.splitlines(keepends)
std::vector<std::string> split_lines(std::string_view s, bool keep_ends);
std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count = -1);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize()
std::string title(std::string_view s);       // str.title()
bool is_lower(std::string_view s);           // str.islower()
bool is_upper(std::string_view s);           // str.isupper()

// Python's slice semantics: the indexes [start:stop:step] selects from a sequence of `length`.
std::vector<int64_t> slice_indexes(int64_t length, std::optional<int64_t> start,
                                   std::optional<int64_t> stop, std::optional<int64_t> step);

std::string float_repr(double value);         // repr(float): 1.0, 1e-07, 1e+16, inf, nan
std::string string_repr(std::string_view s);  // repr(str): 'it''s' -> "it's"

}  // namespace nibble::jinja
