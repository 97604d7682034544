// Jinja's tests (`x is defined`, `x is none`, `x is string`...) with jinja2's definitions: bools
// count as numbers but not as integers, Undefined is iterable and a sequence, `sameas` is identity
// (for data: same type and equal, which is what `is` means for None/True/False and small values).
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_pystr.h"
#include "tokenizer/jinja_render.h"

namespace nibble::jinja {
namespace {

using TestFn = bool (*)(const Value& subject, const Value& arg);

const Json& json_of(const Value& v) {
  static const Json kNothing;
  return v.is_data() ? v.data() : kNothing;
}

bool data_is(const Value& v, Json::value_t type) {
  return v.is_data() && v.data().type() == type;
}

bool t_defined(const Value& v, const Value&) {
  return v.is_defined();
}
bool t_undefined(const Value& v, const Value&) {
  return !v.is_defined();
}
bool t_none(const Value& v, const Value&) {
  return v.is_none();
}
bool t_boolean(const Value& v, const Value&) {
  return data_is(v, Json::value_t::boolean);
}
bool t_true(const Value& v, const Value&) {
  return t_boolean(v, v) && v.data().get<bool>();
}
bool t_false(const Value& v, const Value&) {
  return t_boolean(v, v) && !v.data().get<bool>();
}
bool t_integer(const Value& v, const Value&) {
  return v.is_data() && v.data().is_number_integer();
}
bool t_float(const Value& v, const Value&) {
  return data_is(v, Json::value_t::number_float);
}
bool t_number(const Value& v, const Value&) {
  return v.is_data() && is_number(v.data());
}
bool t_string(const Value& v, const Value&) {
  return v.is_string();
}
bool t_mapping(const Value& v, const Value&) {
  return data_is(v, Json::value_t::object);
}
bool t_iterable(const Value& v, const Value&) {
  return !v.is_defined() || v.is_string() || json_of(v).is_array() || json_of(v).is_object();
}
bool t_sequence(const Value& v, const Value& arg) {
  return t_iterable(v, arg);
}
bool t_callable(const Value& v, const Value&) {
  return v.kind() == ValueKind::kCallable;
}
bool t_sameas(const Value& v, const Value& arg) {
  if (v.is_data() && arg.is_data())
    return v.data().type() == arg.data().type() && v.data() == arg.data();
  return equals(v, arg);
}
bool t_eq(const Value& v, const Value& arg) {
  return compare_op(Op::kEq, v, arg);
}
bool t_ne(const Value& v, const Value& arg) {
  return compare_op(Op::kNe, v, arg);
}
bool t_lt(const Value& v, const Value& arg) {
  return compare_op(Op::kLt, v, arg);
}
bool t_le(const Value& v, const Value& arg) {
  return compare_op(Op::kLe, v, arg);
}
bool t_gt(const Value& v, const Value& arg) {
  return compare_op(Op::kGt, v, arg);
}
bool t_ge(const Value& v, const Value& arg) {
  return compare_op(Op::kGe, v, arg);
}
bool t_in(const Value& v, const Value& arg) {
  return compare_op(Op::kIn, v, arg);
}
bool t_odd(const Value& v, const Value&) {
  return binary_op(Op::kMod, v, Value(Json(2))).data() == 1;
}
bool t_even(const Value& v, const Value&) {
  return binary_op(Op::kMod, v, Value(Json(2))).data() == 0;
}
bool t_divisibleby(const Value& v, const Value& arg) {
  return !truthy(binary_op(Op::kMod, v, arg));
}
bool t_lower(const Value& v, const Value&) {
  return is_lower(to_str(v));
}
bool t_upper(const Value& v, const Value&) {
  return is_upper(to_str(v));
}
bool t_filter(const Value& v, const Value&) {
  return v.is_string() && is_filter(v.string());
}
bool t_test(const Value& v, const Value&) {
  return v.is_string() && is_test(v.string());
}
bool t_escaped(const Value&, const Value&) {
  return false;
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
  bool takes_arg;
};

constexpr TestEntry kTests[] = {
    {"defined", t_defined, false},
    {"undefined", t_undefined, false},
    {"none", t_none, false},
    {"boolean", t_boolean, false},
    {"true", t_true, false},
    {"false", t_false, false},
    {"integer", t_integer, false},
    {"float", t_float, false},
    {"number", t_number, false},
    {"string", t_string, false},
    {"mapping", t_mapping, false},
    {"iterable", t_iterable, false},
    {"sequence", t_sequence, false},
    {"callable", t_callable, false},
    {"sameas", t_sameas, true},
    {"eq", t_eq, true},
    {"equalto", t_eq, true},
    {"==", t_eq, true},
    {"ne", t_ne, true},
    {"!=", t_ne, true},
    {"lt", t_lt, true},
    {"lessthan", t_lt, true},
    {"<", t_lt, true},
    {"le", t_le, true},
    {"<=", t_le, true},
    {"gt", t_gt, true},
    {"greaterthan", t_gt, true},
    {">", t_gt, true},
    {"ge", t_ge, true},
    {">=", t_ge, true},
    {"in", t_in, true},
    {"odd", t_odd, false},
    {"even", t_even, false},
    {"divisibleby", t_divisibleby, true},
    {"lower", t_lower, false},
    {"upper", t_upper, false},
    {"filter", t_filter, false},
    {"test", t_test, false},
    {"escaped", t_escaped, false},
};

}  // namespace

bool is_test(std::string_view name) {
  for (const auto& entry : kTests) {
    if (entry.name == name) return true;
  }
  return false;
}

bool apply_test(std::string_view name, const Value& subject, const CallArgs& args) {
  for (const auto& entry : kTests) {
    if (entry.name != name) continue;
    const std::string function = "test " + std::string(name);
    if (!entry.takes_arg) {
      Arguments(function, args, {});
      return entry.fn(subject, Value());
    }
    const Arguments a(function, args, {"other"});
    if (!a.find(0)) raise(function, " needs an argument");
    return entry.fn(subject, *a.find(0));
  }
  raise("no test named '", name, "'");
}

}  // namespace nibble::jinja
