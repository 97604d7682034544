// Jinja's sequence filters (first last list join reverse sort unique map select reject selectattr
// rejectattr sum min max batch dictsort items) and the filter lookup by name. `attribute`
// arguments are dotted paths looked up item-first, as jinja2's make_attrgetter does.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tokenizer/jinja_filters_util.h"
#include "tokenizer/jinja_pystr.h"
#include "tokenizer/jinja_render.h"

namespace nibble::jinja {
namespace {

Value list_of(std::vector<Value> items) {
  Json out = Json::array();
  for (const auto& item : items) out.push_back(item.to_element());
  return Value(std::move(out));
}

// What jinja2's generator filters (map, select, unique, batch, items...) return.
Value iterator_of(std::vector<Value> items, std::string type = "generator") {
  auto it = std::make_shared<Iterator>();
  it->type = std::move(type);
  it->items = list_of(std::move(items)).data();
  return Value::of(std::move(it));
}

// jinja2's make_attrgetter: "a.b.0" looks up item a, then b, then index 0. Empty: the value.
Value attribute_of(const Value& item, const Value& path, const Value& fallback = Value()) {
  if (path.is_none() || !path.is_defined()) return item;
  Value current = item;
  if (path.is_data() && is_integer(path.data())) return get_item(current, path);
  for (const auto& part : split(to_str(path), std::string("."), -1)) {
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    current = get_item(current, digits ? Value(Json(std::stoll(part))) : Value(Json(part)));
  }
  return !current.is_defined() && fallback.is_defined() ? fallback : current;
}

Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
  Value key = attribute_of(item, attribute);
  if (!case_sensitive && key.is_string()) return Value(Json(lower(key.string())));
  return key;
}

Value f_first(const Value& v, const CallArgs& args) {
  Arguments("first", args, {});
  if (v.kind() == ValueKind::kIterator) {  // next(iter(gen)) takes one item
    Iterator& it = v.iterator();
    it.check();
    if (it.next < it.items.size()) return Value(it.items[it.next++]);
    return Value::undefined("No first item, sequence was empty.");
  }
  const auto items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& v, const CallArgs& args) {
  Arguments("last", args, {});
  if (v.kind() == ValueKind::kIterator) raise("'", type_name(v), "' object is not reversible");
  const auto items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_list(const Value& v, const CallArgs& args) {
  Arguments("list", args, {});
  return list_of(iterate(v));
}

Value f_join(const Value& v, const CallArgs& args) {
  const Arguments a("join", args, {"d", "attribute"});
  const std::string separator = to_str(a.get(0, Value(Json(""))));
  std::string out;
  bool first = true;
  for (const auto& item : iterate(v)) {
    if (!first) out += separator;
    first = false;
    out += to_str(attribute_of(item, a.get(1)));
  }
  return Value(Json(std::move(out)));
}

Value f_reverse(const Value& v, const CallArgs& args) {
  Arguments("reverse", args, {});
  if (v.is_string()) {
    std::u32string chars = decode(v.string());
    std::reverse(chars.begin(), chars.end());
    return Value(Json(encode(chars)));
  }
  const bool reversible = v.is_data() && v.data().is_structured();  // else: list(value) reversed
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  if (!reversible) return list_of(std::move(items));
  return iterator_of(std::move(items),
                     v.data().is_array() ? "list_reverseiterator" : "dict_reversekeyiterator");
}

Value f_sort(const Value& v, const CallArgs& args) {
  const Arguments a("sort", args, {"reverse", "case_sensitive", "attribute"});
  const bool descending = truthy(a.get(0, Value(Json(false))));
  const bool case_sensitive = truthy(a.get(1, Value(Json(false))));
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : iterate(v)) keyed.emplace_back(sort_key(item, a.get(2), case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return descending ? less(y.first, x.first) : less(x.first, y.first);
  });
  std::vector<Value> items;
  for (auto& [key, item] : keyed) items.push_back(std::move(item));
  return list_of(std::move(items));
}

Value f_unique(const Value& v, const CallArgs& args) {
  const Arguments a("unique", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = truthy(a.get(0, Value(Json(false))));
  std::vector<Value> seen;
  std::vector<Value> items;
  for (auto& item : iterate(v)) {
    Value key = sort_key(item, a.get(1), case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); }))
      continue;
    seen.push_back(std::move(key));
    items.push_back(std::move(item));
  }
  return iterator_of(std::move(items));
}

Value f_map(const Value& v, const CallArgs& args) {
  std::vector<Value> out;
  if (!truthy(v)) return iterator_of(out);  // jinja2 checks `if seq:` before iterating
  if (args.positional.empty()) {
    const Arguments a("map", args, {"attribute", "default"});
    if (!a.find(0)) raise("map requires a filter name or attribute=");
    for (const auto& item : iterate(v)) out.push_back(attribute_of(item, *a.find(0), a.get(1)));
  } else {
    const std::string filter = to_str(args.positional[0]);
    if (!is_filter(filter)) raise("no filter named '", filter, "'");
    CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, args.keywords};
    for (const auto& item : iterate(v)) out.push_back(apply_filter(filter, item, rest));
  }
  return iterator_of(std::move(out));
}

// select/reject/selectattr/rejectattr: keep items whose (attribute's) test result is `keep`.
Value select(const Value& v, const CallArgs& args, bool keep, bool by_attribute) {
  size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (args.positional.empty()) raise("missing parameter for attribute name");
    attribute = args.positional[next++];
  }
  std::string test;
  if (next < args.positional.size()) test = to_str(args.positional[next++]);
  if (!test.empty() && !is_test(test)) raise("no test named '", test, "'");
  if (!truthy(v)) return iterator_of({});  // jinja2 checks `if value:` before iterating
  const CallArgs rest{
      {args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end()},
      args.keywords};
  std::vector<Value> out;
  for (const auto& item : iterate(v)) {
    const Value subject = by_attribute ? attribute_of(item, attribute) : item;
    const bool passed = test.empty() ? truthy(subject) : apply_test(test, subject, rest);
    if (passed == keep) out.push_back(item);
  }
  return iterator_of(std::move(out));
}

Value f_select(const Value& v, const CallArgs& args) {
  return select(v, args, true, false);
}
Value f_reject(const Value& v, const CallArgs& args) {
  return select(v, args, false, false);
}
Value f_selectattr(const Value& v, const CallArgs& args) {
  return select(v, args, true, true);
}
Value f_rejectattr(const Value& v, const CallArgs& args) {
  return select(v, args, false, true);
}

Value f_sum(const Value& v, const CallArgs& args) {
  const Arguments a("sum", args, {"attribute", "start"});
  Value total = a.get(1, Value(Json(0)));
  for (const auto& item : iterate(v))
    total = binary_op(Op::kAdd, total, attribute_of(item, a.get(0)));
  return total;
}

Value extreme(const Value& v, const CallArgs& args, bool want_max) {
  const Arguments a(want_max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = truthy(a.get(0, Value(Json(false))));
  Value best = Value::undefined("No aggregated item, sequence was empty.");
  Value best_key;
  bool found = false;
  for (const auto& item : iterate(v)) {
    Value key = sort_key(item, a.get(1), case_sensitive);
    if (!found || (want_max ? less(best_key, key) : less(key, best_key))) {
      best = item;
      best_key = std::move(key);
      found = true;
    }
  }
  return best;
}

Value f_max(const Value& v, const CallArgs& args) {
  return extreme(v, args, true);
}
Value f_min(const Value& v, const CallArgs& args) {
  return extreme(v, args, false);
}

Value f_batch(const Value& v, const CallArgs& args) {
  const Arguments a("batch", args, {"linecount", "fill_with"});
  if (!a.find(0)) raise("batch() needs a line count");
  const int64_t size = to_int(a.find(0)->data());
  if (size <= 0) raise("batch() line count must be positive");
  Json out = Json::array();
  Json row = Json::array();
  for (const auto& item : iterate(v)) {
    row.push_back(item.to_element());
    if (static_cast<int64_t>(row.size()) == size) out.push_back(std::exchange(row, Json::array()));
  }
  if (!row.empty()) {
    if (const Value* fill = a.find(1); fill != nullptr && !fill->is_none()) {
      while (static_cast<int64_t>(row.size()) < size) row.push_back(fill->data());
    }
    out.push_back(std::move(row));
  }
  return iterator_of(iterate(Value(std::move(out))));
}

Value f_items(const Value& v, const CallArgs& args) {
  Arguments("items", args, {});
  if (!v.is_defined()) return iterator_of({});
  if (!v.is_data() || !v.data().is_object()) raise("Can only get item pairs from a mapping.");
  Json out = Json::array();
  for (const auto& [key, item] : v.data().items()) out.push_back(Json::array({key, item}));
  return iterator_of(iterate(Value(std::move(out))));
}

Value f_dictsort(const Value& v, const CallArgs& args) {
  const Arguments a("dictsort", args, {"case_sensitive", "by", "reverse"});
  const bool case_sensitive = truthy(a.get(0, Value(Json(false))));
  const std::string by = to_str(a.get(1, Value(Json("key"))));
  if (by != "key" && by != "value") raise("You can only sort by either \"key\" or \"value\"");
  const Value pairs = f_items(v, {});
  std::vector<Value> items = iterate(pairs);
  const Value index(Json(by == "key" ? 0 : 1));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x, index, case_sensitive);
    const Value ky = sort_key(y, index, case_sensitive);
    return truthy(a.get(2, Value(Json(false)))) ? less(ky, kx) : less(kx, ky);
  });
  return list_of(std::move(items));
}

const FilterTable& filters() {
  static const FilterTable kTable = [] {
    FilterTable table = {
        {"first", f_first},
        {"last", f_last},
        {"list", f_list},
        {"join", f_join},
        {"reverse", f_reverse},
        {"sort", f_sort},
        {"unique", f_unique},
        {"map", f_map},
        {"select", f_select},
        {"reject", f_reject},
        {"selectattr", f_selectattr},
        {"rejectattr", f_rejectattr},
        {"sum", f_sum},
        {"max", f_max},
        {"min", f_min},
        {"batch", f_batch},
        {"items", f_items},
        {"dictsort", f_dictsort},
    };
    register_value_filters(table);
    return table;
  }();
  return kTable;
}

}  // namespace

bool is_filter(std::string_view name) {
  for (const auto& [key, fn] : filters()) {
    if (key == name) return true;
  }
  return false;
}

Value apply_filter(std::string_view name, const Value& subject, const CallArgs& args) {
  // jinja2's generator filters only run when consumed: their errors wait until then.
  constexpr std::string_view kGenerators[] = {"map",        "select", "reject", "selectattr",
                                              "rejectattr", "unique", "batch",  "items"};
  const bool lazy =
      std::find(std::begin(kGenerators), std::end(kGenerators), name) != std::end(kGenerators);
  for (const auto& [key, fn] : filters()) {
    if (key != name) continue;
    if (!lazy) return fn(subject, args);
    try {
      return fn(subject, args);
    } catch (const Unpositioned& e) {
      auto failed = std::make_shared<Iterator>();
      failed->type = "generator";
      failed->error = e.what();
      return Value::of(std::move(failed));
    }
  }
  raise("no filter named '", name, "'");
}

std::optional<int64_t> python_int(const Value& value, int64_t base) {
  if (!value.is_data()) return std::nullopt;
  const Json& j = value.data();
  if (is_integer(j)) return to_int(j);
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  if (!j.is_string()) return std::nullopt;
  std::string digits = strip(j.get_ref<const std::string&>(), std::nullopt, StripSide::kBoth);
  std::string cleaned;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (digits[i] == '_' && i > 0 && i + 1 < digits.size() &&
        std::isalnum(static_cast<unsigned char>(digits[i - 1])) &&
        std::isalnum(static_cast<unsigned char>(digits[i + 1]))) {
      continue;
    }
    cleaned += digits[i];
  }
  if (!cleaned.empty() && cleaned.find_first_of(" \t\n+-", 1) == std::string::npos) {
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(cleaned.c_str(), &end, static_cast<int>(base));
    if (errno == 0 && end == cleaned.c_str() + cleaned.size()) return parsed;
  }
  if (auto as_float = python_float(value)) return python_int(Value(Json(*as_float)), 10);
  return std::nullopt;
}

std::optional<double> python_float(const Value& value) {
  if (!value.is_data()) return std::nullopt;
  const Json& j = value.data();
  if (is_number(j)) return to_double(j);
  if (!j.is_string()) return std::nullopt;
  const std::string s = strip(j.get_ref<const std::string&>(), std::nullopt, StripSide::kBoth);
  if (s.empty() || s.find_first_of("xX(") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double parsed = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return parsed;
}

}  // namespace nibble::jinja
