// Runtime values of nibble's Jinja2 subset (the chat-template engine). Plain data is an ordered
// nlohmann JSON (key order matters: `tojson` must print dicts in insertion order, as Python does);
// the rest is what Jinja adds on top: Undefined, namespace() objects, callables, and the one-pass
// iterators that filters such as map and select return. Not a general Python object model: tuples
// are lists, and dict keys are strings.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace nibble::jinja {

using Json = nlohmann::ordered_json;

struct Namespace;
struct Callable;
struct Iterator;

// Raised by helpers that do not know where in the template they are; the evaluator adds the
// position of the innermost expression and rethrows a plain nibble::Error.
class Unpositioned : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void raise(Args&&... args) {
  throw Unpositioned(cat(std::forward<Args>(args)...));
}

enum class ValueKind : uint8_t { kUndefined, kData, kNamespace, kCallable, kIterator };

class Value {
 public:
  Value() = default;  // Undefined
  // A "discarded" JSON (how lists and dicts hold Undefined, see to_element) makes an Undefined.
  explicit Value(Json json);
  // An element of data owned elsewhere; `owner` keeps it alive (nullptr: caller guarantees it).
  static Value view(std::shared_ptr<const Json> owner, const Json& element);
  // `what` is the error raised when the undefined value is used, e.g. "'x' is undefined".
  static Value undefined(std::string what);
  static Value of(std::shared_ptr<Namespace> ns);
  static Value of(std::shared_ptr<const Callable> callable);
  static Value of(std::shared_ptr<Iterator> iterator);

  ValueKind kind() const { return kind_; }
  bool is_defined() const { return kind_ != ValueKind::kUndefined; }
  bool is_data() const { return kind_ == ValueKind::kData; }
  bool is_string() const { return is_data() && json_->is_string(); }
  bool is_none() const { return is_data() && json_->is_null(); }

  const Json& data() const;  // raises unless is_data()
  // As an element of a list or dict: the data, or for Undefined a "discarded" JSON marker (which
  // reads back as Undefined, so `[missing]` and map(attribute=...) work as in Python).
  Json to_element() const;
  const std::string& string() const;  // raises unless is_string()
  Namespace& ns() const { return *static_cast<Namespace*>(object_.get()); }
  std::shared_ptr<Namespace> shared_ns() const {
    return std::static_pointer_cast<Namespace>(object_);
  }
  const Callable& callable() const { return *static_cast<const Callable*>(object_.get()); }
  Iterator& iterator() const { return *static_cast<Iterator*>(object_.get()); }
  // The value of `element`, a part of data(), sharing its storage.
  Value child(const Json& element) const { return view(json_, element); }
  // The message for using an undefined value.
  std::string undefined_message() const;

 private:
  ValueKind kind_ = ValueKind::kUndefined;
  std::shared_ptr<const Json> json_;
  std::shared_ptr<void> object_;  // the Namespace, Callable or Iterator, per kind_
  std::string what_;
};

// A namespace() object, or a for loop's `loop` (read-only, with cycle()).
enum class NamespaceKind : uint8_t { kNamespace, kLoop };
struct Namespace {
  NamespaceKind kind = NamespaceKind::kNamespace;
  std::vector<std::pair<std::string, Value>> attributes;  // insertion order, for printing
  const Value* find(std::string_view name) const;
  void set(std::string name, Value value);
};

// What Python's generators and reverse iterators do here: always truthy, no len(), and
// iterating consumes (a second loop over the same value sees nothing).
struct Iterator {
  std::string type;   // "generator", "list_reverseiterator"...
  Json items;         // an array, computed when the filter ran
  size_t next = 0;    // items before `next` were consumed
  std::string error;  // what the generator raises once consumed (Python runs it lazily)

  void check() const {
    if (!error.empty()) raise(error);
  }
};

// Python's type name for messages: "str", "int", "list", "dict", "NoneType", "Undefined"...
std::string type_name(const Value& value);
bool truthy(const Value& value);
// Python str() and repr(): what {{ value }} prints.
std::string to_str(const Value& value);
std::string repr(const Value& value);
// Python ==, and <, raising for unorderable types.
bool equals(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);
bool json_equals(const Json& a, const Json& b);

// Numbers the way Python sees them: bool is an int, ints are int64 here.
bool is_number(const Json& j);    // int, float or bool
bool is_integer(const Json& j);   // int or bool
int64_t to_int(const Json& j);    // requires is_integer
double to_double(const Json& j);  // requires is_number

}  // namespace nibble::jinja
