// Renderer of nibble's Jinja2 subset: runs a parsed template against variables. Scoping follows
// Jinja: {% if %} shares its scope, each for-loop iteration gets a fresh child scope (so a set
// inside a loop never outlives its iteration), macros run in a child of the scope that defined
// them, and namespace() objects are the one way to carry state out of a loop.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_builtins.h"

namespace nibble::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> variables;

  const Value* find(std::string_view name) const;  // here or in a parent
  void set(std::string name, Value value);         // here
};

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer() = default;
  ~Renderer();  // breaks reference cycles: scope <-> macro, namespace -> itself
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string render(const Body& body, std::shared_ptr<Scope> variables);

 private:
  Flow exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow exec(const Stmt& stmt, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow exec_for(const Stmt& stmt, const std::shared_ptr<Scope>& scope, std::string& out);
  void assign(const Target& target, Value value, Scope& scope);

  Value eval(const Expr& expr, const std::shared_ptr<Scope>& scope);
  Value eval_unpositioned(const Expr& expr, const std::shared_ptr<Scope>& scope);
  Value eval_call(const Expr& expr, const std::shared_ptr<Scope>& scope);
  // `filter` is a kFilter chain; its innermost subject is `input` when that is null in the tree.
  Value eval_filter(const Expr& filter, const std::shared_ptr<Scope>& scope, const Value* input);
  CallArgs eval_args(const Expr& expr, size_t first, const std::shared_ptr<Scope>& scope);
  Value call_macro(const Callable& macro, const CallArgs& args);

  int macro_depth_ = 0;
  std::vector<std::shared_ptr<Callable>> macros_;     // each holds the scope that holds it
  std::vector<std::shared_ptr<Namespace>> assigned_;  // namespaces given attributes after creation
};

// Python operators over values (jinja_operators.cc).
Value unary_op(Op op, const Value& operand);
Value binary_op(Op op, const Value& left, const Value& right);
bool compare_op(Op op, const Value& left, const Value& right);

}  // namespace nibble::jinja
