// std::unordered_map keyed by std::string that can be searched with a std::string_view.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace nibble::tok {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

template <typename Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

}  // namespace nibble::tok
