// Python's operators over Jinja values: arithmetic with int/float promotion (bool counts as int),
// str and list concatenation and repetition, `%` formatting, ==/< comparisons and `in`.
// Integers are int64; overflow is an error rather than a bignum.
#include <cmath>

#include "tokenizer/jinja_render.h"

namespace nibble::jinja {
namespace {

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  raise("unsupported operand type(s) for ", op, ": '", type_name(a), "' and '", type_name(b), "'");
}

void require_defined(const Value& a, const Value& b) {
  if (!a.is_defined()) raise(a.undefined_message());
  if (!b.is_defined()) raise(b.undefined_message());
}

Value integer(int64_t value) {
  return Value(Json(value));
}
Value number(double value) {
  return Value(Json(value));
}

enum class IntOp : uint8_t { kAdd, kSub, kMul };
Value checked(IntOp op, int64_t a, int64_t b) {
  int64_t result = 0;
  const bool overflow = op == IntOp::kAdd   ? __builtin_add_overflow(a, b, &result)
                        : op == IntOp::kSub ? __builtin_sub_overflow(a, b, &result)
                                            : __builtin_mul_overflow(a, b, &result);
  if (overflow) raise("integer overflow");
  return Value(Json(result));
}

Value repeat(const Value& sequence, int64_t times) {
  const Json& data = sequence.data();
  if (data.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += data.get_ref<const std::string&>();
    return Value(Json(std::move(out)));
  }
  Json out = Json::array();
  for (int64_t i = 0; i < times; ++i) {
    for (const auto& item : data) out.push_back(item);
  }
  return Value(std::move(out));
}

double floor_mod(double a, double b) {
  const double m = std::fmod(a, b);
  if (m == 0) return std::copysign(0.0, b);
  return (m < 0) != (b < 0) ? m + b : m;
}

// CPython's float floor division.
double float_floor_div(double x, double y) {
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1.0;
  if (div == 0) return std::copysign(0.0, x / y);
  double floored = std::floor(div);
  if (div - floored > 0.5) floored += 1.0;
  return floored;
}

bool contains(const Value& container, const Value& item) {
  if (!container.is_defined()) return false;       // Undefined iterates as empty
  if (container.kind() == ValueKind::kIterator) {  // consumes up to the match, as Python does
    Iterator& it = container.iterator();
    it.check();
    while (it.next < it.items.size()) {
      if (equals(Value(it.items[it.next++]), item)) return true;
    }
    return false;
  }
  if (!container.is_data()) raise("argument of type '", type_name(container), "' is not iterable");
  const Json& haystack = container.data();
  if (haystack.is_string()) {
    if (!item.is_string()) {
      raise("'in <string>' requires string as left operand, not ", type_name(item));
    }
    return haystack.get_ref<const std::string&>().find(item.string()) != std::string::npos;
  }
  if (haystack.is_array()) {
    for (const auto& element : haystack) {
      if (equals(container.child(element), item)) return true;
    }
    return false;
  }
  if (haystack.is_object()) {
    if (item.is_data() && item.data().is_structured())
      raise("unhashable type: '", type_name(item), "'");
    return item.is_string() && haystack.contains(item.string());
  }
  raise("argument of type '", type_name(container), "' is not iterable");
}

}  // namespace

Value unary_op(Op op, const Value& operand) {
  if (op == Op::kNot) return Value(Json(!truthy(operand)));
  if (!operand.is_defined()) raise(operand.undefined_message());
  const Json& j = operand.data();
  if (!is_number(j))
    raise("bad operand type for unary ", op == Op::kNeg ? "-" : "+", ": '", type_name(operand),
          "'");
  if (op == Op::kPos) return j.is_number_float() ? operand : integer(to_int(j));
  if (j.is_number_float()) return number(-j.get<double>());
  return checked(IntOp::kSub, 0, to_int(j));
}

Value binary_op(Op op, const Value& left, const Value& right) {
  require_defined(left, right);
  const Json& a = left.data();
  const Json& b = right.data();
  const bool numbers = is_number(a) && is_number(b);
  const bool integers = is_integer(a) && is_integer(b);
  switch (op) {
    case Op::kAdd:
      if (integers) return checked(IntOp::kAdd, to_int(a), to_int(b));
      if (numbers) return number(to_double(a) + to_double(b));
      if (a.is_string() && b.is_string()) {
        return Value(Json(a.get_ref<const std::string&>() + b.get_ref<const std::string&>()));
      }
      if (a.is_array() && b.is_array()) {
        Json out = a;
        for (const auto& item : b) out.push_back(item);
        return Value(std::move(out));
      }
      if (a.is_string()) raise("can only concatenate str (not \"", type_name(right), "\") to str");
      if (a.is_array()) raise("can only concatenate list (not \"", type_name(right), "\") to list");
      unsupported("+", left, right);
    case Op::kSub:
      if (integers) return checked(IntOp::kSub, to_int(a), to_int(b));
      if (numbers) return number(to_double(a) - to_double(b));
      unsupported("-", left, right);
    case Op::kMul:
      if (integers) return checked(IntOp::kMul, to_int(a), to_int(b));
      if (numbers) return number(to_double(a) * to_double(b));
      if ((a.is_string() || a.is_array()) && is_integer(b)) return repeat(left, to_int(b));
      if ((b.is_string() || b.is_array()) && is_integer(a)) return repeat(right, to_int(a));
      unsupported("*", left, right);
    case Op::kDiv:
      if (!numbers) unsupported("/", left, right);
      if (to_double(b) == 0) raise("division by zero");
      return number(to_double(a) / to_double(b));
    case Op::kFloorDiv:
      if (!numbers) unsupported("//", left, right);
      if (to_double(b) == 0) raise("integer division or modulo by zero");
      if (integers) {
        const int64_t x = to_int(a);
        const int64_t y = to_int(b);
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return integer(q);
      }
      return number(float_floor_div(to_double(a), to_double(b)));
    case Op::kMod:
      if (a.is_string())
        return Value(Json(percent_format(a.get_ref<const std::string&>(), right,
                                         b.is_array() ? Spread::kYes : Spread::kNo)));
      if (!numbers) unsupported("%", left, right);
      if (to_double(b) == 0) raise("integer division or modulo by zero");
      if (integers) {
        const int64_t y = to_int(b);
        int64_t m = to_int(a) % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return integer(m);
      }
      return number(floor_mod(to_double(a), to_double(b)));
    case Op::kPow:
      if (integers && to_int(b) >= 0) {
        int64_t base = to_int(a);
        int64_t exponent = to_int(b);
        int64_t power = 1;
        while (exponent-- > 0) {
          if (__builtin_mul_overflow(power, base, &power)) raise("integer overflow");
        }
        return integer(power);
      }
      if (numbers) return number(std::pow(to_double(a), to_double(b)));
      unsupported("**", left, right);
    default:
      break;
  }
  raise("unsupported operator");
}

bool compare_op(Op op, const Value& left, const Value& right) {
  switch (op) {
    case Op::kEq:
      return equals(left, right);
    case Op::kNe:
      return !equals(left, right);
    case Op::kLt:
      return less(left, right);
    case Op::kGt:
      return less(right, left);
    case Op::kLe:
      return less(left, right) || equals(left, right);
    case Op::kGe:
      return less(right, left) || equals(left, right);
    case Op::kIn:
      return contains(right, left);
    case Op::kNotIn:
      return !contains(right, left);
    default:
      raise("unsupported comparison");
  }
}

}  // namespace nibble::jinja
