// Reading tokenizer.json components with errors that name the file and the JSON path of the field,
// e.g. `.../tokenizer.json: pre_tokenizer.pretokenizers[1].behavior: expected a string`.
// Internal to src/tokenizer; each component's factory takes a JsonContext.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace nibble::tok {

using Json = nlohmann::json;

struct JsonContext {
  std::string file;  // shown at the start of every error

  [[noreturn]] void fail_at(std::string_view where, std::string_view what) const;
  // `component` ("normalizer", "model", ...) had a "type" nibble does not implement.
  [[noreturn]] void unsupported(std::string_view component, std::string_view type,
                                std::string_view supported) const;

  const Json& member(const Json& obj, const char* key, std::string_view where) const;
  std::string string_member(const Json& obj, const char* key, std::string_view where) const;
  // Absent or null gives `fallback`.
  bool bool_member(const Json& obj, const char* key, std::string_view where, bool fallback) const;
  int64_t int_member(const Json& obj, const char* key, std::string_view where,
                     int64_t fallback) const;
  // The "type" of a component object (which must be an object).
  std::string type_of(const Json& obj, std::string_view where) const;
};

// "where.key" and "where[i]" for error paths.
std::string path_join(std::string_view where, std::string_view key);
std::string path_index(std::string_view where, std::size_t i);

}  // namespace nibble::tok
