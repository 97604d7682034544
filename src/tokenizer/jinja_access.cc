// Attribute, item and slice lookup, iteration and len() for Jinja values, the way jinja2's
// sandboxed environment does them: `x.name` tries a method of x first and then x["name"];
// `x[key]` tries the item first and then the method; a missing one is Undefined, not an error.
// Also the argument binder shared by filters, tests and methods.
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_pystr.h"

namespace nibble::jinja {
namespace {

constexpr std::string_view kStrMethods[] = {
    "startswith", "endswith",   "split",     "rsplit",       "strip",        "lstrip",
    "rstrip",     "replace",    "upper",     "lower",        "title",        "capitalize",
    "find",       "rfind",      "count",     "join",         "splitlines",   "isspace",
    "isdigit",    "isalpha",    "isalnum",   "islower",      "isupper",      "format",
    "index",      "rindex",     "casefold",  "center",       "encode",       "expandtabs",
    "format_map", "isascii",    "isdecimal", "isidentifier", "isnumeric",    "isprintable",
    "istitle",    "ljust",      "maketrans", "partition",    "removeprefix", "removesuffix",
    "rjust",      "rpartition", "swapcase",  "translate",    "zfill"};
constexpr std::string_view kDictMethods[] = {"items",  "keys",  "values",  "get",
                                             "copy",   "pop",   "popitem", "setdefault",
                                             "update", "clear", "fromkeys"};
constexpr std::string_view kListMethods[] = {"index",  "count",   "append", "extend",
                                             "insert", "remove",  "pop",    "clear",
                                             "copy",   "reverse", "sort"};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  for (const auto candidate : names) {
    if (candidate == name) return true;
  }
  return false;
}

Value method(const Value& self, std::string_view name) {
  auto callable = std::make_shared<Callable>();
  callable->builtin = Builtin::kMethod;
  callable->name = std::string(name);
  callable->self = self;
  return Value::of(std::shared_ptr<const Callable>(std::move(callable)));
}

// The bound method `name` of `object` when Python has one, else Undefined.
Value find_method(const Value& object, std::string_view name) {
  if (object.kind() == ValueKind::kNamespace) {
    if (object.ns().kind == NamespaceKind::kLoop && name == "cycle") return method(object, name);
    return Value();
  }
  if (!object.is_data()) return Value();
  const Json& j = object.data();
  const bool found = (j.is_string() && listed(kStrMethods, name)) ||
                     (j.is_object() && listed(kDictMethods, name)) ||
                     (j.is_array() && listed(kListMethods, name));
  return found ? method(object, name) : Value();
}

std::string object_name(const Value& object) {
  return object.is_data() ? type_name(object) + " object" : type_name(object);
}

std::optional<int64_t> slice_bound(const Value& bound) {
  if (bound.is_none()) return std::nullopt;
  if (!bound.is_data() || !is_integer(bound.data())) {
    raise("slice indices must be integers or None, not ", type_name(bound));
  }
  return to_int(bound.data());
}

}  // namespace

Arguments::Arguments(std::string_view function, const CallArgs& args,
                     std::initializer_list<std::string_view> params)
    : bound_(params.size(), nullptr) {
  const std::vector<std::string_view> names(params);
  if (args.positional.size() > names.size()) {
    raise(function, "() takes at most ", names.size(), " argument(s), got ",
          args.positional.size());
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = &args.positional[i];
  for (const auto& [name, value] : args.keywords) {
    size_t i = 0;
    while (i < names.size() && names[i] != name) ++i;
    if (i == names.size()) raise(function, "() got an unexpected keyword argument '", name, "'");
    if (bound_[i] != nullptr) raise(function, "() got multiple values for argument '", name, "'");
    bound_[i] = &value;
  }
}

const Value* Arguments::find(size_t index) const {
  return bound_[index];
}

Value Arguments::get(size_t index, Value fallback) const {
  return bound_[index] != nullptr ? *bound_[index] : fallback;
}

Value get_attribute(const Value& object, std::string_view name) {
  if (!object.is_defined()) raise(object.undefined_message());
  if (!name.empty() && name[0] == '_') {
    return Value::undefined("access to attribute '" + std::string(name) + "' is unsafe");
  }
  Value found = find_method(object, name);
  if (found.is_defined()) return found;
  if (object.kind() == ValueKind::kNamespace) {
    if (const Value* attribute = object.ns().find(name)) return *attribute;
  } else if (object.is_data() && object.data().is_object()) {
    const Json& dict = object.data();
    const auto it = dict.find(name);
    if (it != dict.end()) return object.child(*it);
  }
  return Value::undefined("'" + object_name(object) + "' has no attribute '" + std::string(name) +
                          "'");
}

Value get_item(const Value& object, const Value& key) {
  if (!object.is_defined()) raise(object.undefined_message());
  if (object.is_data() && key.is_data()) {
    const Json& j = object.data();
    const Json& k = key.data();
    if (j.is_object() && k.is_string()) {
      const auto it = j.find(k.get_ref<const std::string&>());
      if (it != j.end()) return object.child(*it);
    } else if ((j.is_array() || j.is_string()) && is_integer(k)) {
      const int64_t size = j.is_array() ? static_cast<int64_t>(j.size()) : length(object);
      int64_t index = to_int(k);
      if (index < 0) index += size;
      if (index >= 0 && index < size) {
        if (j.is_array()) return object.child(j[static_cast<size_t>(index)]);
        const std::u32string chars = decode(j.get_ref<const std::string&>());
        return Value(
            Json(encode(std::u32string_view(chars).substr(static_cast<size_t>(index), 1))));
      }
      return Value::undefined("'" + object_name(object) + "' has no element " + k.dump());
    }
  }
  if (key.is_string()) return get_attribute(object, key.string());
  return Value::undefined("'" + object_name(object) + "' has no element " + to_str(key));
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (!object.is_defined()) raise(object.undefined_message());
  const auto first = slice_bound(start);
  const auto last = slice_bound(stop);
  const auto stride = slice_bound(step);
  if (object.is_string()) {
    const std::u32string chars = decode(object.string());
    std::u32string out;
    for (const int64_t i : slice_indexes(static_cast<int64_t>(chars.size()), first, last, stride)) {
      out += chars[static_cast<size_t>(i)];
    }
    return Value(Json(encode(out)));
  }
  if (object.is_data() && object.data().is_array()) {
    const Json& list = object.data();
    Json out = Json::array();
    for (const int64_t i : slice_indexes(static_cast<int64_t>(list.size()), first, last, stride)) {
      out.push_back(list[static_cast<size_t>(i)]);
    }
    return Value(std::move(out));
  }
  return Value::undefined("'" + object_name(object) + "' is not subscriptable");
}

std::vector<Value> iterate(const Value& value) {
  std::vector<Value> items;
  if (!value.is_defined()) return items;
  if (value.kind() == ValueKind::kIterator) {
    Iterator& it = value.iterator();
    it.check();
    for (; it.next < it.items.size(); ++it.next) items.push_back(Value(it.items[it.next]));
    return items;
  }
  if (value.is_data()) {
    const Json& j = value.data();
    if (j.is_array()) {
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(value.child(item));
      return items;
    }
    if (j.is_object()) {
      for (const auto& [key, item] : j.items()) items.emplace_back(Json(key));
      return items;
    }
    if (j.is_string()) {
      for (const char32_t c : decode(j.get_ref<const std::string&>())) {
        items.emplace_back(Json(encode(std::u32string(1, c))));
      }
      return items;
    }
  }
  raise("'", type_name(value), "' object is not iterable");
}

int64_t length(const Value& value) {
  if (!value.is_defined()) return 0;
  if (value.is_data()) {
    const Json& j = value.data();
    if (j.is_string()) return code_point_count(j.get_ref<const std::string&>());
    if (j.is_array() || j.is_object()) return static_cast<int64_t>(j.size());
  }
  raise("object of type '", type_name(value), "' has no len()");
}

}  // namespace nibble::jinja
