// What Jinja templates can call: filters (jinja_filters.cc, jinja_seq_filters.cc, jinja_json.cc),
// tests (jinja_tests.cc), methods of str/dict/list values and the globals (jinja_methods.cc),
// %-formatting (jinja_format.cc), and lookup the way Jinja's sandboxed environment does it
// (jinja_access.cc). All raise jinja::Unpositioned; the evaluator adds the template position.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace nibble::jinja {

struct Stmt;
struct Scope;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// Binds CallArgs to a Python-style parameter list: positional first, then by keyword.
class Arguments {
 public:
  Arguments(std::string_view function, const CallArgs& args,
            std::initializer_list<std::string_view> params);
  const Value* find(size_t index) const;  // nullptr when not given
  Value get(size_t index, Value fallback = Value()) const;

 private:
  std::vector<const Value*> bound_;
};

enum class Builtin : uint8_t {
  kNamespace,       // namespace(...)
  kRaiseException,  // raise_exception(message), from Hugging Face
  kStrftimeNow,     // strftime_now(format), from Hugging Face
  kRange,
  kDict,
  kMethod,  // `name` of `self`, e.g. "split" of a str
  kMacro,   // {% macro %}, run by the renderer
};

struct Callable {
  Builtin builtin;
  std::string name;
  Value self;                      // kMethod
  const Stmt* macro = nullptr;     // kMacro
  std::shared_ptr<Scope> closure;  // kMacro: where it was defined
};

bool is_filter(std::string_view name);
bool is_test(std::string_view name);
Value apply_filter(std::string_view name, const Value& subject, const CallArgs& args);
bool apply_test(std::string_view name, const Value& subject, const CallArgs& args);

// The global function `name`, or Undefined.
Value global(std::string_view name);
// Calls a global function or a method; not macros.
Value call_builtin(const Callable& callable, const CallArgs& args);

Value get_attribute(const Value& object, std::string_view name);
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] for strings and lists.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The elements a for loop or a filter iterates over: list items, dict keys, string characters.
std::vector<Value> iterate(const Value& value);
// Python len().
int64_t length(const Value& value);
// Python's `format % args` (%s %r %d %i %f %x %%...): the % operator and the format filter. `args`
// is one value, or a list of them when `spread` (a Python tuple).
enum class Spread : uint8_t { kNo, kYes };
std::string percent_format(const std::string& format, const Value& args, Spread spread);
// Jinja's tojson as Hugging Face defines it: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys) (see jinja_json.cc).
std::string to_json(const Value& value, const CallArgs& args);

}  // namespace nibble::jinja
