// Python's printf-style `format % args` for Jinja's % operator and format filter:
// %[(key)][flags][width][.precision]type with types s r a d i u x X o c e E f F g G and %%.
#include <cstdio>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_pystr.h"

namespace nibble::jinja {
namespace {

std::string pad(std::string text, int64_t width, bool left) {
  const int64_t missing = width - code_point_count(text);
  if (missing <= 0) return text;
  const std::string fill(static_cast<size_t>(missing), ' ');
  return left ? text + fill : fill + text;
}

std::string printf_number(const std::string& spec, const Json& number, char type) {
  char buffer[512];
  if (type == 'e' || type == 'E' || type == 'f' || type == 'F' || type == 'g' || type == 'G') {
    std::snprintf(buffer, sizeof(buffer), (spec + type).c_str(), to_double(number));
  } else {
    const long long value = number.is_number_float() ? static_cast<long long>(number.get<double>())
                                                     : static_cast<long long>(to_int(number));
    if ((type == 'x' || type == 'X' || type == 'o') && value < 0) {
      std::string positive_spec = spec;
      std::snprintf(buffer, sizeof(buffer), (positive_spec + "ll" + type).c_str(), -value);
      return "-" + std::string(buffer);
    }
    std::snprintf(buffer, sizeof(buffer),
                  (spec + "ll" + (type == 'i' || type == 'u' ? 'd' : type)).c_str(), value);
  }
  return buffer;
}

}  // namespace

std::string percent_format(const std::string& format, const Value& args, Spread spread) {
  std::vector<Value> values;
  const bool mapping = spread == Spread::kNo && args.is_data() && args.data().is_object();
  if (spread == Spread::kYes) {
    values = iterate(args);
  } else {
    values.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) raise("incomplete format");
    if (format[i] == '%') {
      out += '%';
      continue;
    }
    Value value;
    bool have_value = false;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) raise("incomplete format key");
      if (!mapping) raise("format requires a mapping");
      value = get_item(args, Value(Json(format.substr(i + 1, close - i - 1))));
      if (!value.is_defined())
        raise("format key ", format.substr(i + 1, close - i - 1), " not found");
      have_value = true;
      i = close + 1;
    }
    std::string spec = "%";
    bool left = false;
    while (i < format.size() &&
           std::string_view("-+ #0").find(format[i]) != std::string_view::npos) {
      left = left || format[i] == '-';
      spec += format[i++];
    }
    int64_t width = 0;
    while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
      width = width * 10 + (format[i] - '0');
      spec += format[i++];
    }
    std::optional<int64_t> precision;
    if (i < format.size() && format[i] == '.') {
      spec += format[i++];
      precision = 0;
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
        *precision = *precision * 10 + (format[i] - '0');
        spec += format[i++];
      }
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) raise("incomplete format");
    const char type = format[i];
    if (!have_value) {
      if (next >= values.size()) raise("not enough arguments for format string");
      value = values[next++];
    }
    if (type == 's' || type == 'r' || type == 'a') {
      std::string text = type == 's' ? to_str(value) : repr(value);
      if (precision) text = encode(decode(text).substr(0, static_cast<size_t>(*precision)));
      out += pad(std::move(text), width, left);
    } else if (type == 'c') {
      std::string text =
          value.is_string()
              ? value.string()
              : encode(std::u32string(1, static_cast<char32_t>(to_int(value.data()))));
      out += pad(std::move(text), width, left);
    } else if (std::string_view("diuxXoeEfFgG").find(type) != std::string_view::npos) {
      if (!value.is_data() || !is_number(value.data())) {
        raise("%", type, " format: a real number is required, not ", type_name(value));
      }
      if ((type == 'x' || type == 'X' || type == 'o') && !is_integer(value.data())) {
        raise("%", type, " format: an integer is required, not ", type_name(value));
      }
      out += printf_number(spec, value.data(), type);
    } else {
      raise("unsupported format character '", type, "'");
    }
  }
  if (!mapping && next < values.size())
    raise("not all arguments converted during string formatting");
  return out;
}

}  // namespace nibble::jinja
