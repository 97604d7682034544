// Internal to the Jinja filters: the filter table that jinja_filters.cc (value and string filters)
// and jinja_seq_filters.cc (sequence filters, and the lookup) fill, and shared conversions.
#pragma once

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_builtins.h"

namespace nibble::jinja {

using FilterFn = Value (*)(const Value& subject, const CallArgs& args);
using FilterTable = std::vector<std::pair<std::string_view, FilterFn>>;

void register_value_filters(FilterTable& table);

// Python int(x) / int(s, base) and float(x), or nullopt where Python raises.
std::optional<int64_t> python_int(const Value& value, int64_t base);
std::optional<double> python_float(const Value& value);

}  // namespace nibble::jinja
