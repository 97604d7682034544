// Field access helpers for tokenizer.json with one-line errors (see json_context.h).
#include "tokenizer/json_context.h"

#include "core/error.h"

namespace nibble::tok {

void JsonContext::fail_at(std::string_view where, std::string_view what) const {
  fail(file, ": ", where, ": ", what);
}

void JsonContext::unsupported(std::string_view component, std::string_view type,
                              std::string_view supported) const {
  fail(file, ": ", component, " type \"", type, "\" is not supported (supported: ", supported, ")");
}

const Json& JsonContext::member(const Json& obj, const char* key, std::string_view where) const {
  if (!obj.is_object()) fail_at(where, "expected an object");
  const auto it = obj.find(key);
  if (it == obj.end()) fail_at(path_join(where, key), "missing field");
  return *it;
}

std::string JsonContext::string_member(const Json& obj, const char* key,
                                       std::string_view where) const {
  const Json& value = member(obj, key, where);
  if (!value.is_string()) fail_at(path_join(where, key), "expected a string");
  return value.get<std::string>();
}

bool JsonContext::bool_member(const Json& obj, const char* key, std::string_view where,
                              bool fallback) const {
  if (!obj.is_object()) fail_at(where, "expected an object");
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail_at(path_join(where, key), "expected true or false");
  return it->get<bool>();
}

int64_t JsonContext::int_member(const Json& obj, const char* key, std::string_view where,
                                int64_t fallback) const {
  if (!obj.is_object()) fail_at(where, "expected an object");
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) fail_at(path_join(where, key), "expected an integer");
  return it->get<int64_t>();
}

std::string JsonContext::type_of(const Json& obj, std::string_view where) const {
  return string_member(obj, "type", where);
}

std::string path_join(std::string_view where, std::string_view key) {
  return where.empty() ? std::string(key) : cat(where, ".", key);
}

std::string path_index(std::string_view where, std::size_t i) {
  return cat(where, "[", i, "]");
}

}  // namespace nibble::tok
