// Jinja's built-in value and string filters, with jinja2's signatures and Python results:
// default/d length/count trim upper lower capitalize title string safe replace indent truncate
// center wordcount escape/e format int float abs round attr, and Hugging Face's tojson. The
// sequence filters are in jinja_seq_filters.cc.
#include <unicode/uchar.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_filters_util.h"
#include "tokenizer/jinja_pystr.h"

namespace nibble::jinja {
namespace {

Value text(std::string s) {
  return Value(Json(std::move(s)));
}
void no_args(std::string_view filter, const CallArgs& args) {
  Arguments(filter, args, {});
}

Value f_default(const Value& v, const CallArgs& args) {
  const Arguments a("default", args, {"default_value", "boolean"});
  const bool use_default = !v.is_defined() || (truthy(a.get(1, Value(Json(false)))) && !truthy(v));
  return use_default ? a.get(0, text("")) : v;
}

Value f_length(const Value& v, const CallArgs& args) {
  const Arguments a("length", args, {});
  return Value(Json(length(v)));
}

Value f_trim(const Value& v, const CallArgs& args) {
  const Arguments a("trim", args, {"chars"});
  const Value chars = a.get(0, Value(Json(nullptr)));
  return text(strip(to_str(v), chars.is_none() ? std::nullopt : std::optional(to_str(chars)),
                    StripSide::kBoth));
}

Value f_upper(const Value& v, const CallArgs& args) {
  no_args("upper", args);
  return text(upper(to_str(v)));
}
Value f_lower(const Value& v, const CallArgs& args) {
  no_args("lower", args);
  return text(lower(to_str(v)));
}
Value f_capitalize(const Value& v, const CallArgs& args) {
  no_args("capitalize", args);
  return text(capitalize(to_str(v)));
}
Value f_string(const Value& v, const CallArgs& args) {
  no_args("string", args);
  return text(to_str(v));
}
Value f_safe(const Value& v, const CallArgs& args) {
  no_args("safe", args);
  return v;
}
Value f_tojson(const Value& v, const CallArgs& args) {
  return text(to_json(v, args));
}

Value f_title(const Value& v, const CallArgs& args) {
  const Arguments a("title", args, {});
  // Jinja: words start after runs of "-", whitespace, "(", "{", "[" or "<".
  const auto is_break = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c);
  };
  const std::u32string s = decode(to_str(v));
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i + 1;
    while (j < s.size() && is_break(s[j]) == is_break(s[i])) ++j;
    out += upper(encode(s.substr(i, 1))) + lower(encode(s.substr(i + 1, j - i - 1)));
    i = j;
  }
  return text(std::move(out));
}

Value f_replace(const Value& v, const CallArgs& args) {
  const Arguments a("replace", args, {"old", "new", "count"});
  if (!a.find(0) || !a.find(1)) raise("replace() needs old and new");
  const Value count = a.get(2, Value(Json(nullptr)));
  return text(replace(to_str(v), to_str(*a.find(0)), to_str(*a.find(1)),
                      count.is_none() ? -1 : to_int(count.data())));
}

Value f_indent(const Value& v, const CallArgs& args) {
  const Arguments a("indent", args, {"width", "first", "blank"});
  const Value width = a.get(0, Value(Json(4)));
  const std::string indention =
      width.is_string()
          ? width.string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, to_int(width.data()))), ' ');
  if (!v.is_string())
    raise("indent: unsupported operand type(s) for +=: '", type_name(v), "' and 'str'");
  const std::vector<std::string> lines = split_lines(v.string() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    const bool indent_line = i > 0 && (truthy(a.get(2, Value(Json(false)))) || !lines[i].empty());
    out += (indent_line ? indention : "") + lines[i];
  }
  if (truthy(a.get(1, Value(Json(false))))) out = indention + out;
  return text(std::move(out));
}

Value f_truncate(const Value& v, const CallArgs& args) {
  const Arguments a("truncate", args, {"length", "killwords", "end", "leeway"});
  const int64_t size = to_int(a.get(0, Value(Json(255))).data());
  const std::string end = to_str(a.get(2, text("...")));
  const int64_t leeway = to_int(a.get(3, Value(Json(5))).data());
  if (!v.is_string()) {  // jinja2 returns anything short enough as is
    if (length(v) <= size + leeway) return v;
    raise("truncate: expected a string, got ", type_name(v));
  }
  const std::u32string s = decode(v.string());
  const auto end_size = static_cast<int64_t>(decode(end).size());
  if (size < end_size) raise("expected length >= ", end_size, ", got ", size);
  if (static_cast<int64_t>(s.size()) <= size + leeway) return text(encode(s));
  std::string kept = encode(s.substr(0, static_cast<size_t>(size - end_size)));
  if (!truthy(a.get(1, Value(Json(false)))))
    kept = split(kept, std::string(" "), 1, StripSide::kRight)[0];
  return text(kept + end);
}

Value f_center(const Value& v, const CallArgs& args) {
  const Arguments a("center", args, {"width"});
  const int64_t width = to_int(a.get(0, Value(Json(80))).data());
  const std::string s = to_str(v);
  const int64_t missing = width - code_point_count(s);
  if (missing <= 0) return text(s);
  const int64_t left = missing / 2 + (missing & width & 1);
  return text(std::string(static_cast<size_t>(left), ' ') + s +
              std::string(static_cast<size_t>(missing - left), ' '));
}

Value f_wordcount(const Value& v, const CallArgs& args) {
  const Arguments a("wordcount", args, {});
  int64_t words = 0;
  bool in_word = false;
  for (const char32_t c : decode(to_str(v))) {
    const bool word = c == '_' || u_isalnum(static_cast<UChar32>(c)) ||
                      u_charType(static_cast<UChar32>(c)) == U_NON_SPACING_MARK;
    words += word && !in_word;
    in_word = word;
  }
  return Value(Json(words));
}

Value f_escape(const Value& v, const CallArgs& args) {
  const Arguments a("escape", args, {});
  std::string out;
  for (const char c : to_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return text(std::move(out));
}

Value f_format(const Value& v, const CallArgs& args) {
  if (!args.positional.empty() && !args.keywords.empty())
    raise("can't handle positional and keyword arguments at the same time");
  if (!args.keywords.empty()) {
    Json mapping = Json::object();
    for (const auto& [name, value] : args.keywords) mapping[name] = value.to_element();
    return text(percent_format(to_str(v), Value(std::move(mapping)), Spread::kNo));
  }
  Json list = Json::array();
  for (const auto& value : args.positional) list.push_back(value.to_element());
  return text(percent_format(to_str(v), Value(std::move(list)), Spread::kYes));
}

Value f_int(const Value& v, const CallArgs& args) {
  const Arguments a("int", args, {"default", "base"});
  if (!v.is_defined()) raise(v.undefined_message());  // int(Undefined) raises in Python
  if (auto parsed = python_int(v, to_int(a.get(1, Value(Json(10))).data())))
    return Value(Json(*parsed));
  return a.get(0, Value(Json(0)));
}

Value f_float(const Value& v, const CallArgs& args) {
  const Arguments a("float", args, {"default"});
  if (!v.is_defined()) raise(v.undefined_message());
  if (auto parsed = python_float(v)) return Value(Json(*parsed));
  return a.get(0, Value(Json(0.0)));
}

Value f_abs(const Value& v, const CallArgs& args) {
  const Arguments a("abs", args, {});
  const Json& j = v.data();
  if (!is_number(j)) raise("bad operand type for abs(): '", type_name(v), "'");
  if (j.is_number_float()) return Value(Json(std::fabs(j.get<double>())));
  return Value(Json(std::llabs(to_int(j))));
}

Value f_round(const Value& v, const CallArgs& args) {
  const Arguments a("round", args, {"precision", "method"});
  const int64_t precision = to_int(a.get(0, Value(Json(0))).data());
  const std::string method = to_str(a.get(1, text("common")));
  const Json& j = v.data();
  if (!is_number(j)) raise("round: expected a number, got ", type_name(v));
  if (precision < 0 || precision > 300) raise("round: unsupported precision ", precision);
  const double x = to_double(j);
  if (method == "common") {
    if (is_integer(j)) return Value(Json(to_int(j)));
    char buffer[512];
    std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(precision), x);
    return Value(Json(std::strtod(buffer, nullptr)));
  }
  if (method != "floor" && method != "ceil") raise("method must be common, ceil or floor");
  const double scale = std::pow(10.0, static_cast<double>(precision));
  return Value(Json((method == "floor" ? std::floor(x * scale) : std::ceil(x * scale)) / scale));
}

Value f_attr(const Value& v, const CallArgs& args) {
  const Arguments a("attr", args, {"name"});
  if (!a.find(0)) raise("attr() needs a name");
  const std::string name = to_str(*a.find(0));
  if (v.kind() == ValueKind::kNamespace) return get_attribute(v, name);
  const Value found = get_attribute(v, name);
  return found.kind() == ValueKind::kCallable ? found
                                              : Value::undefined("no attribute '" + name + "'");
}

}  // namespace

void register_value_filters(FilterTable& table) {
  table.emplace_back("default", f_default);
  table.emplace_back("d", f_default);
  table.emplace_back("length", f_length);
  table.emplace_back("count", f_length);
  table.emplace_back("trim", f_trim);
  table.emplace_back("upper", f_upper);
  table.emplace_back("lower", f_lower);
  table.emplace_back("capitalize", f_capitalize);
  table.emplace_back("title", f_title);
  table.emplace_back("string", f_string);
  table.emplace_back("safe", f_safe);
  table.emplace_back("tojson", f_tojson);
  table.emplace_back("replace", f_replace);
  table.emplace_back("indent", f_indent);
  table.emplace_back("truncate", f_truncate);
  table.emplace_back("center", f_center);
  table.emplace_back("wordcount", f_wordcount);
  table.emplace_back("escape", f_escape);
  table.emplace_back("e", f_escape);
  table.emplace_back("format", f_format);
  table.emplace_back("int", f_int);
  table.emplace_back("float", f_float);
  table.emplace_back("abs", f_abs);
  table.emplace_back("round", f_round);
  table.emplace_back("attr", f_attr);
}

}  // namespace nibble::jinja
