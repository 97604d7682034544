// The tojson filter as Hugging Face chat templates define it: Python's
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False), byte for byte
// (", " and ": " separators by default, "," with an indent, floats as repr(), keys in insertion
// order). Not Jinja's own tojson, which escapes HTML characters.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_pystr.h"

namespace nibble::jinja {
namespace {

struct JsonStyle {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

void append_escaped(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (const char32_t c : decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    char buffer[16];
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        const unsigned v = static_cast<unsigned>(c) - 0x10000;
        std::snprintf(buffer, sizeof(buffer), "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                      0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(c));
      }
      out += buffer;
    } else {
      out += encode(std::u32string(1, c));
    }
  }
  out += '"';
}

void newline(std::string& out, const JsonStyle& style, int depth) {
  out += '\n';
  for (int i = 0; i < depth; ++i) out += *style.indent;
}

void dump(std::string& out, const Json& j, const JsonStyle& style, int depth) {
  switch (j.type()) {
    case Json::value_t::null:
      out += "null";
      return;
    case Json::value_t::discarded:  // an Undefined inside a list or dict
      raise("Object of type Undefined is not JSON serializable");
    case Json::value_t::boolean:
      out += j.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::string:
      append_escaped(out, j.get_ref<const std::string&>(), style.ensure_ascii);
      return;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d < 0 ? "-Infinity" : "Infinity";
      else
        out += float_repr(d);
      return;
    }
    case Json::value_t::array:
    case Json::value_t::object: {
      const bool is_array = j.is_array();
      if (j.empty()) {
        out += is_array ? "[]" : "{}";
        return;
      }
      out += is_array ? '[' : '{';
      std::vector<std::pair<const std::string*, const Json*>> members;
      if (!is_array) {
        for (const auto& [key, item] : j.items()) members.emplace_back(&key, &item);
        if (style.sort_keys) {
          std::stable_sort(members.begin(), members.end(),
                           [](const auto& a, const auto& b) { return *a.first < *b.first; });
        }
      }
      for (size_t i = 0; i < j.size(); ++i) {
        if (i > 0) out += style.item_separator;
        if (style.indent) newline(out, style, depth + 1);
        if (is_array) {
          dump(out, j[i], style, depth + 1);
        } else {
          append_escaped(out, *members[i].first, style.ensure_ascii);
          out += style.key_separator;
          dump(out, *members[i].second, style, depth + 1);
        }
      }
      if (style.indent) newline(out, style, depth);
      out += is_array ? ']' : '}';
      return;
    }
    default:
      out += j.dump();
      return;
  }
}

}  // namespace

std::string to_json(const Value& value, const CallArgs& args) {
  const Arguments a("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (!value.is_data()) raise("Object of type ", type_name(value), " is not JSON serializable");
  JsonStyle style;
  style.ensure_ascii = truthy(a.get(0, Value(Json(false))));
  const Value indent = a.get(1, Value(Json(nullptr)));
  if (indent.is_string()) {
    style.indent = indent.string();
  } else if (!indent.is_none()) {
    if (!indent.is_data() || !is_integer(indent.data()))
      raise("tojson: indent must be an int or a string");
    style.indent =
        std::string(static_cast<size_t>(std::max<int64_t>(0, to_int(indent.data()))), ' ');
  }
  if (style.indent) style.item_separator = ",";
  const Value separators = a.get(2, Value(Json(nullptr)));
  if (!separators.is_none()) {
    const Json& pair = separators.data();
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string()) {
      raise("tojson: separators must be a pair of strings");
    }
    style.item_separator = pair[0].get<std::string>();
    style.key_separator = pair[1].get<std::string>();
  }
  style.sort_keys = truthy(a.get(3, Value(Json(false))));
  std::string out;
  dump(out, value.data(), style, 0);
  return out;
}

}  // namespace nibble::jinja
