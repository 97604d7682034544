// Global functions (namespace, range, dict, and Hugging Face's raise_exception and strftime_now)
// and the methods of str, dict and list values that chat templates call, with Python's semantics.
// Mutating methods are refused, as in Jinja's ImmutableSandboxedEnvironment.
#include <unicode/uchar.h>

#include <ctime>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_pystr.h"

namespace nibble::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value text(std::string s) {
  return Value(Json(std::move(s)));
}
Value boolean(bool b) {
  return Value(Json(b));
}

std::optional<std::string> optional_string(const Value& value, std::string_view what) {
  if (!value.is_defined() || value.is_none()) return std::nullopt;
  if (!value.is_string()) raise(what, " arg must be None or str, not ", type_name(value));
  return value.string();
}

int64_t integer_arg(const Value& value, std::string_view what) {
  if (!value.is_data() || !is_integer(value.data())) {
    raise(what, ": expected an integer, got ", type_name(value));
  }
  return to_int(value.data());
}

// The byte offset `offset` of `s` as a code point index.
int64_t char_index(const std::string& s, size_t offset) {
  return offset == std::string::npos ? -1 : code_point_count(std::string_view(s).substr(0, offset));
}

bool all_chars(const std::string& s, bool (*predicate)(char32_t)) {
  if (s.empty()) return false;
  for (const char32_t c : decode(s)) {
    if (!predicate(c)) return false;
  }
  return true;
}

Value string_list(const std::vector<std::string>& parts) {
  Json out = Json::array();
  for (const auto& part : parts) out.push_back(part);
  return Value(std::move(out));
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  const auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_string()) return one(affix.string());
  if (affix.is_data() && affix.data().is_array()) {
    for (const auto& item : affix.data()) {
      if (!item.is_string()) raise("tuple for startswith/endswith must only contain str");
      if (one(item.get_ref<const std::string&>())) return true;
    }
    return false;
  }
  raise(prefix ? "startswith" : "endswith", " first arg must be str or a tuple of str, not ",
        type_name(affix));
}

Value str_method(const std::string& name, const std::string& s, const CallArgs& args) {
  const std::string function = "str." + name;
  if (name == "startswith" || name == "endswith") {
    const Arguments a(function, args, {"prefix"});
    if (!a.find(0)) raise(function, "() takes at least 1 argument");
    return boolean(affix_matches(s, *a.find(0), name == "startswith"));
  }
  if (name == "split" || name == "rsplit") {
    const Arguments a(function, args, {"sep", "maxsplit"});
    const auto sep = optional_string(a.get(0), "sep");
    const int64_t max_split = a.find(1) ? integer_arg(*a.find(1), function) : -1;
    return string_list(
        split(s, sep, max_split, name == "split" ? StripSide::kLeft : StripSide::kRight));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Arguments a(function, args, {"chars"});
    const StripSide side = name == "strip"    ? StripSide::kBoth
                           : name == "lstrip" ? StripSide::kLeft
                                              : StripSide::kRight;
    return text(strip(s, optional_string(a.get(0), "chars"), side));
  }
  if (name == "replace") {
    const Arguments a(function, args, {"old", "new", "count"});
    if (!a.find(0) || !a.find(1) || !a.find(0)->is_string() || !a.find(1)->is_string()) {
      raise(function, "() takes two string arguments");
    }
    const int64_t count = a.find(2) ? integer_arg(*a.find(2), function) : -1;
    return text(replace(s, a.find(0)->string(), a.find(1)->string(), count));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const Arguments a(function, args, {"sub"});
    if (!a.find(0) || !a.find(0)->is_string()) raise(function, "() takes a string argument");
    const std::string& sub = a.find(0)->string();
    if (name == "count") {
      if (sub.empty()) return Value(Json(code_point_count(s) + 1));
      int64_t count = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
        ++count;
      return Value(Json(count));
    }
    const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos && (name == "index" || name == "rindex"))
      raise("substring not found");
    return Value(Json(char_index(s, at)));
  }
  if (name == "join") {
    const Arguments a(function, args, {"iterable"});
    if (!a.find(0)) raise(function, "() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(*a.find(0))) {
      if (!item.is_string())
        raise("sequence item: expected str instance, ", type_name(item), " found");
      if (!first) out += s;
      first = false;
      out += item.string();
    }
    return text(std::move(out));
  }
  if (name == "splitlines") {
    const Arguments a(function, args, {"keepends"});
    return string_list(split_lines(s, truthy(a.get(0, boolean(false)))));
  }
  const Arguments none(function, args, {});
  if (name == "upper") return text(upper(s));
  if (name == "lower" || name == "casefold") return text(lower(s));
  if (name == "title") return text(title(s));
  if (name == "capitalize") return text(capitalize(s));
  if (name == "islower") return boolean(is_lower(s));
  if (name == "isupper") return boolean(is_upper(s));
  if (name == "isspace") return boolean(all_chars(s, is_space));
  if (name == "isdigit")
    return boolean(
        all_chars(s, [](char32_t c) { return u_isdigit(static_cast<UChar32>(c)) != 0; }));
  if (name == "isalpha")
    return boolean(
        all_chars(s, [](char32_t c) { return u_isalpha(static_cast<UChar32>(c)) != 0; }));
  if (name == "isalnum")
    return boolean(
        all_chars(s, [](char32_t c) { return u_isalnum(static_cast<UChar32>(c)) != 0; }));
  raise("str.", name, "() is not supported");
}

Value dict_method(const std::string& name, const Value& self, const CallArgs& args) {
  const Json& dict = self.data();
  const std::string function = "dict." + name;
  if (name == "get") {
    const Arguments a(function, args, {"key", "default"});
    if (!a.find(0)) raise(function, "() takes at least 1 argument");
    if (a.find(0)->is_string()) {
      const auto it = dict.find(a.find(0)->string());
      if (it != dict.end()) return self.child(*it);
    }
    return a.get(1, Value(Json(nullptr)));
  }
  const Arguments none(function, args, {});
  Json out = Json::array();
  for (const auto& [key, item] : dict.items()) {
    if (name == "items")
      out.push_back(Json::array({key, item}));
    else if (name == "keys")
      out.push_back(key);
    else if (name == "values")
      out.push_back(item);
    else
      raise("dict.", name, "() is not supported: templates cannot modify data");
  }
  return Value(std::move(out));
}

Value list_method(const std::string& name, const Value& self, const CallArgs& args) {
  const std::string function = "list." + name;
  if (name != "index" && name != "count")
    raise(function, "() is not supported: templates cannot modify data");
  const Arguments a(function, args, {"value"});
  if (!a.find(0)) raise(function, "() takes exactly one argument");
  int64_t count = 0;
  int64_t index = 0;
  for (const Value& item : iterate(self)) {
    if (equals(item, *a.find(0))) {
      if (name == "index") return Value(Json(index));
      ++count;
    }
    ++index;
  }
  if (name == "index") raise(repr(*a.find(0)), " is not in list");
  return Value(Json(count));
}

Value make_callable(Builtin builtin, std::string name) {
  auto callable = std::make_shared<Callable>();
  callable->builtin = builtin;
  callable->name = std::move(name);
  return Value::of(std::shared_ptr<const Callable>(std::move(callable)));
}

// Keyword arguments (and an optional leading mapping) as name/value pairs: dict() and namespace().
std::vector<std::pair<std::string, Value>> mapping_args(const std::string& function,
                                                        const CallArgs& args) {
  std::vector<std::pair<std::string, Value>> out;
  if (args.positional.size() > 1) raise(function, "() takes at most 1 positional argument");
  if (!args.positional.empty()) {
    const Value& base = args.positional[0];
    if (!base.is_data() || !base.data().is_object())
      raise(function, "() argument must be a mapping");
    for (const auto& [key, item] : base.data().items()) out.emplace_back(key, base.child(item));
  }
  for (const auto& keyword : args.keywords) out.push_back(keyword);
  return out;
}

}  // namespace

Value global(std::string_view name) {
  if (name == "namespace") return make_callable(Builtin::kNamespace, "namespace");
  if (name == "raise_exception") return make_callable(Builtin::kRaiseException, "raise_exception");
  if (name == "strftime_now") return make_callable(Builtin::kStrftimeNow, "strftime_now");
  if (name == "range") return make_callable(Builtin::kRange, "range");
  if (name == "dict") return make_callable(Builtin::kDict, "dict");
  return Value();
}

Value call_builtin(const Callable& callable, const CallArgs& args) {
  switch (callable.builtin) {
    case Builtin::kNamespace: {
      auto ns = std::make_shared<Namespace>();
      for (auto& [name, value] : mapping_args("namespace", args)) {
        if (!name.empty() && name[0] == '_')
          raise("namespace attributes cannot start with '_': '", name, "'");
        ns->set(name, value);
      }
      return Value::of(std::move(ns));
    }
    case Builtin::kDict: {
      Json out = Json::object();
      for (auto& [name, value] : mapping_args("dict", args)) out[name] = value.to_element();
      return Value(std::move(out));
    }
    case Builtin::kRaiseException: {
      const Arguments a("raise_exception", args, {"message"});
      raise(to_str(a.get(0)));
    }
    case Builtin::kStrftimeNow: {
      const Arguments a("strftime_now", args, {"format"});
      if (!a.find(0) || !a.find(0)->is_string()) raise("strftime_now() takes a format string");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[512];
      const size_t n = std::strftime(buffer, sizeof(buffer), a.find(0)->string().c_str(), &local);
      return text(std::string(buffer, n));
    }
    case Builtin::kRange: {
      if (!args.keywords.empty() || args.positional.empty() || args.positional.size() > 3) {
        raise("range() takes 1 to 3 positional arguments");
      }
      std::vector<int64_t> bounds;
      for (const Value& arg : args.positional) bounds.push_back(integer_arg(arg, "range"));
      const int64_t start = bounds.size() == 1 ? 0 : bounds[0];
      const int64_t stop = bounds.size() == 1 ? bounds[0] : bounds[1];
      const int64_t step = bounds.size() == 3 ? bounds[2] : 1;
      if (step == 0) raise("range() arg 3 must not be zero");
      Json out = Json::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<int64_t>(out.size()) >= kMaxRange)
          raise("range too big (more than ", kMaxRange, " items)");
        out.push_back(i);
      }
      return Value(std::move(out));
    }
    case Builtin::kMethod: {
      const Value& self = callable.self;
      if (self.kind() == ValueKind::kNamespace) {  // loop.cycle(...)
        if (args.positional.empty()) raise("no items for cycling given");
        const int64_t index = to_int(self.ns().find("index0")->data());
        return args.positional[static_cast<size_t>(index) % args.positional.size()];
      }
      const Json& j = self.data();
      if (j.is_string()) return str_method(callable.name, j.get_ref<const std::string&>(), args);
      if (j.is_object()) return dict_method(callable.name, self, args);
      return list_method(callable.name, self, args);
    }
    case Builtin::kMacro:
      break;
  }
  raise("cannot call ", callable.name);
}

}  // namespace nibble::jinja
