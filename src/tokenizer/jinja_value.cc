// Values of the Jinja engine: Python's truthiness, str(), repr(), == and < over JSON data.
#include "tokenizer/jinja_value.h"

#include <limits>

#include "tokenizer/jinja_pystr.h"

namespace nibble::jinja {
namespace {

std::string data_repr(const Json& j, bool top_level_str);

std::string number_str(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number_float()) return float_repr(j.get<double>());
  return j.dump();
}

std::string data_repr(const Json& j, bool top_level_str) {
  switch (j.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::discarded:
      return top_level_str ? "" : "Undefined";
    case Json::value_t::string:
      return top_level_str ? j.get_ref<const std::string&>()
                           : string_repr(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < j.size(); ++i) {
        if (i > 0) out += ", ";
        out += data_repr(j[i], false);
      }
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : j.items()) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(key) + ": " + data_repr(item, false);
      }
      return out + "}";
    }
    default:
      return number_str(j);
  }
}

std::string namespace_repr(const Namespace& ns) {
  if (ns.kind == NamespaceKind::kLoop) return "<LoopContext>";
  std::string out = "<Namespace {";
  bool first = true;
  for (const auto& [name, value] : ns.attributes) {
    if (!first) out += ", ";
    first = false;
    out += string_repr(name) + ": " + repr(value);
  }
  return out + "}>";
}

int compare_numbers(const Json& a, const Json& b) {
  if (is_integer(a) && is_integer(b)) {
    const int64_t x = to_int(a);
    const int64_t y = to_int(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  const double x = to_double(a);
  const double y = to_double(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

bool json_less(const Json& a, const Json& b) {
  if (is_number(a) && is_number(b)) return compare_numbers(a, b) < 0;
  if (a.is_string() && b.is_string()) {
    return a.get_ref<const std::string&>() < b.get_ref<const std::string&>();
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (!json_equals(a[i], b[i])) return json_less(a[i], b[i]);
    }
    return a.size() < b.size();
  }
  raise("'<' not supported between instances of '", type_name(Value(a)), "' and '",
        type_name(Value(b)), "'");
}

}  // namespace

Value::Value(Json json) {
  if (json.is_discarded()) return;
  kind_ = ValueKind::kData;
  json_ = std::make_shared<Json>(std::move(json));
}

Value Value::view(std::shared_ptr<const Json> owner, const Json& element) {
  if (element.is_discarded()) return undefined("value is undefined");
  Value value;
  value.kind_ = ValueKind::kData;
  value.json_ = std::shared_ptr<const Json>(std::move(owner), &element);
  return value;
}

Value Value::undefined(std::string what) {
  Value value;
  value.what_ = std::move(what);
  return value;
}

Value Value::of(std::shared_ptr<Namespace> ns) {
  Value value;
  value.kind_ = ValueKind::kNamespace;
  value.object_ = std::move(ns);
  return value;
}

Value Value::of(std::shared_ptr<const Callable> callable) {
  Value value;
  value.kind_ = ValueKind::kCallable;
  value.object_ = std::const_pointer_cast<Callable>(std::move(callable));
  return value;
}

Value Value::of(std::shared_ptr<Iterator> iterator) {
  Value value;
  value.kind_ = ValueKind::kIterator;
  value.object_ = std::move(iterator);
  return value;
}

const Json& Value::data() const {
  if (kind_ == ValueKind::kUndefined) raise(undefined_message());
  if (kind_ != ValueKind::kData) raise("expected plain data, got ", type_name(*this));
  return *json_;
}

Json Value::to_element() const {
  if (kind_ == ValueKind::kUndefined) return Json(Json::value_t::discarded);
  if (kind_ != ValueKind::kData)
    raise("a ", type_name(*this), " cannot be stored in a list or dict");
  return *json_;
}

const std::string& Value::string() const {
  if (!is_string()) raise("expected a string, got ", type_name(*this));
  return json_->get_ref<const std::string&>();
}

std::string Value::undefined_message() const {
  return what_.empty() ? "value is undefined" : what_;
}

const Value* Namespace::find(std::string_view name) const {
  for (const auto& [key, value] : attributes) {
    if (key == name) return &value;
  }
  return nullptr;
}

void Namespace::set(std::string name, Value value) {
  for (auto& [key, existing] : attributes) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  attributes.emplace_back(std::move(name), std::move(value));
}

std::string type_name(const Value& value) {
  switch (value.kind()) {
    case ValueKind::kUndefined:
      return "Undefined";
    case ValueKind::kNamespace:
      return value.ns().kind == NamespaceKind::kLoop ? "LoopContext" : "Namespace";
    case ValueKind::kCallable:
      return "function";
    case ValueKind::kIterator:
      return value.iterator().type;
    case ValueKind::kData:
      break;
  }
  const Json& j = value.data();
  switch (j.type()) {
    case Json::value_t::null:
      return "NoneType";
    case Json::value_t::discarded:
      return "Undefined";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::string:
      return "str";
    case Json::value_t::array:
      return "list";
    case Json::value_t::object:
      return "dict";
    case Json::value_t::number_float:
      return "float";
    default:
      return "int";
  }
}

bool truthy(const Value& value) {
  if (!value.is_data()) return value.is_defined();
  const Json& j = value.data();
  switch (j.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
      return !j.empty();
    case Json::value_t::number_float:
      return j.get<double>() != 0.0;
    default:
      return to_int(j) != 0;
  }
}

std::string to_str(const Value& value) {
  switch (value.kind()) {
    case ValueKind::kUndefined:
      return "";
    case ValueKind::kData:
      return data_repr(value.data(), true);
    default:
      return repr(value);
  }
}

std::string repr(const Value& value) {
  switch (value.kind()) {
    case ValueKind::kUndefined:
      return "Undefined";
    case ValueKind::kNamespace:
      return namespace_repr(value.ns());
    case ValueKind::kCallable:
      return "<function>";
    case ValueKind::kIterator:
      return "<" + value.iterator().type + " object>";
    case ValueKind::kData:
      break;
  }
  return data_repr(value.data(), false);
}

bool json_equals(const Json& a, const Json& b) {
  if (is_number(a) && is_number(b)) return compare_numbers(a, b) == 0;
  if (a.type() != b.type()) return false;
  if (a.is_discarded()) return true;  // Undefined == Undefined
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!json_equals(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [key, item] : a.items()) {
      const auto it = b.find(key);
      if (it == b.end() || !json_equals(item, *it)) return false;
    }
    return true;
  }
  return a == b;
}

bool equals(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kUndefined:
      return true;
    case ValueKind::kData:
      return json_equals(a.data(), b.data());
    case ValueKind::kNamespace:
      return &a.ns() == &b.ns();
    case ValueKind::kCallable:
      return &a.callable() == &b.callable();
    case ValueKind::kIterator:
      return &a.iterator() == &b.iterator();
  }
  return false;
}

bool less(const Value& a, const Value& b) {
  if (!a.is_data() || !b.is_data()) {
    if (!a.is_defined()) raise(a.undefined_message());
    if (!b.is_defined()) raise(b.undefined_message());
    raise("'<' not supported between instances of '", type_name(a), "' and '", type_name(b), "'");
  }
  return json_less(a.data(), b.data());
}

bool is_number(const Json& j) {
  return j.is_number() || j.is_boolean();
}
bool is_integer(const Json& j) {
  return j.is_number_integer() || j.is_boolean();
}

int64_t to_int(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      raise("integer ", u, " is too large");
    }
    return static_cast<int64_t>(u);
  }
  return j.get<int64_t>();
}

double to_double(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1.0 : 0.0;
  return j.get<double>();
}

}  // namespace nibble::jinja
