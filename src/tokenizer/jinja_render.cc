// Statement execution and expression evaluation for the Jinja renderer (see jinja_render.h).
// Errors raised below an expression get that expression's line and column here.
#include "tokenizer/jinja_render.h"

#include <algorithm>

namespace nibble::jinja {
namespace {

constexpr int kMaxMacroDepth = 200;

Value boolean(bool b) {
  return Value(Json(b));
}

Value loop_object(const std::vector<Value>& items, size_t i) {
  auto loop = std::make_shared<Namespace>();
  loop->kind = NamespaceKind::kLoop;
  const auto n = static_cast<int64_t>(items.size());
  const auto index = static_cast<int64_t>(i);
  loop->set("index0", Value(Json(index)));
  loop->set("index", Value(Json(index + 1)));
  loop->set("revindex0", Value(Json(n - index - 1)));
  loop->set("revindex", Value(Json(n - index)));
  loop->set("first", boolean(i == 0));
  loop->set("last", boolean(index == n - 1));
  loop->set("length", Value(Json(n)));
  loop->set("depth0", Value(Json(0)));
  loop->set("depth", Value(Json(1)));
  loop->set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  loop->set("nextitem", index + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
  return Value::of(std::move(loop));
}

}  // namespace

const Value* Scope::find(std::string_view name) const {
  for (const Scope* scope = this; scope != nullptr; scope = scope->parent.get()) {
    for (const auto& [key, value] : scope->variables) {
      if (key == name) return &value;
    }
  }
  return nullptr;
}

void Scope::set(std::string name, Value value) {
  for (auto& [key, existing] : variables) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  variables.emplace_back(std::move(name), std::move(value));
}

Renderer::~Renderer() {
  for (const auto& macro : macros_) macro->closure.reset();
  for (const auto& ns : assigned_) ns->attributes.clear();
}

std::string Renderer::render(const Body& body, std::shared_ptr<Scope> variables) {
  std::string out;
  exec(body, variables, out);
  return out;
}

Flow Renderer::exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out) {
  for (const auto& stmt : body) {
    Flow flow;
    try {
      flow = exec(*stmt, scope, out);
    } catch (const Unpositioned& e) {
      fail(describe(stmt->position), ": ", e.what());
    }
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Flow Renderer::exec(const Stmt& stmt, const std::shared_ptr<Scope>& scope, std::string& out) {
  switch (stmt.kind) {
    case StmtKind::kText:
      out += stmt.text;
      return Flow::kNormal;
    case StmtKind::kOutput:
      out += to_str(eval(*stmt.expr, scope));
      return Flow::kNormal;
    case StmtKind::kIf:
      for (const auto& branch : stmt.branches) {
        if (!branch.condition || truthy(eval(*branch.condition, scope))) {
          return exec(branch.body, scope, out);
        }
      }
      return Flow::kNormal;
    case StmtKind::kFor:
      return exec_for(stmt, scope, out);
    case StmtKind::kSet:
      assign(stmt.target, eval(*stmt.expr, scope), *scope);
      return Flow::kNormal;
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock: {
      std::string text;
      exec(stmt.body, scope, text);
      Value value(Json(std::move(text)));
      if (stmt.expr) value = eval_filter(*stmt.expr, scope, &value);
      if (stmt.kind == StmtKind::kSetBlock) {
        assign(stmt.target, std::move(value), *scope);
      } else {
        out += to_str(value);
      }
      return Flow::kNormal;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kMacro: {
      auto macro = std::make_shared<Callable>();
      macro->builtin = Builtin::kMacro;
      macro->name = stmt.target.names[0];
      macro->macro = &stmt;
      macro->closure = scope;
      macros_.push_back(macro);
      scope->set(stmt.target.names[0],
                 Value::of(std::shared_ptr<const Callable>(std::move(macro))));
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      for (size_t i = 0; i < stmt.params.size(); ++i) {
        inner->set(stmt.params[i], eval(*stmt.defaults[i], scope));
      }
      return exec(stmt.body, inner, out);
    }
    case StmtKind::kScope:
      return exec(stmt.body, scope, out);
  }
  return Flow::kNormal;
}

Flow Renderer::exec_for(const Stmt& stmt, const std::shared_ptr<Scope>& scope, std::string& out) {
  std::vector<Value> items = iterate(eval(*stmt.expr, scope));
  if (stmt.condition) {
    std::vector<Value> kept;
    for (auto& item : items) {
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      assign(stmt.target, item, *probe);
      if (truthy(eval(*stmt.condition, probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(stmt.else_body, scope, out);
  for (size_t i = 0; i < items.size(); ++i) {
    auto iteration = std::make_shared<Scope>();
    iteration->parent = scope;
    iteration->set("loop", loop_object(items, i));
    assign(stmt.target, items[i], *iteration);
    if (exec(stmt.body, iteration, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Renderer::assign(const Target& target, Value value, Scope& scope) {
  if (!target.attribute.empty()) {
    const Value* object = scope.find(target.names[0]);
    if (object == nullptr || object->kind() != ValueKind::kNamespace ||
        object->ns().kind != NamespaceKind::kNamespace) {
      raise("cannot assign attribute on non-namespace object '", target.names[0], "'");
    }
    if (target.attribute[0] == '_') {
      raise("chat templates cannot store underscore-prefixed attributes on a namespace, but got '",
            target.attribute, "'");
    }
    if (std::find(assigned_.begin(), assigned_.end(), object->shared_ns()) == assigned_.end()) {
      assigned_.push_back(object->shared_ns());
    }
    object->ns().set(target.attribute, std::move(value));
    return;
  }
  if (target.names.size() == 1) {
    scope.set(target.names[0], std::move(value));
    return;
  }
  std::vector<Value> parts = iterate(value);
  if (parts.size() != target.names.size()) {
    raise(parts.size() < target.names.size() ? "not enough" : "too many",
          " values to unpack (expected ", target.names.size(), ", got ", parts.size(), ")");
  }
  for (size_t i = 0; i < parts.size(); ++i) scope.set(target.names[i], std::move(parts[i]));
}

Value Renderer::eval(const Expr& expr, const std::shared_ptr<Scope>& scope) {
  try {
    return eval_unpositioned(expr, scope);
  } catch (const Unpositioned& e) {
    fail(describe(expr.position), ": ", e.what());
  }
}

Value Renderer::eval_unpositioned(const Expr& expr, const std::shared_ptr<Scope>& scope) {
  const auto& operands = expr.operands;
  switch (expr.kind) {
    case ExprKind::kLiteral:
      return Value::view(nullptr, expr.literal);  // the tree outlives the render
    case ExprKind::kName: {
      if (const Value* value = scope->find(expr.name)) return *value;
      Value builtin = global(expr.name);
      return builtin.is_defined() ? builtin : Value::undefined("'" + expr.name + "' is undefined");
    }
    case ExprKind::kList:
    case ExprKind::kDict: {
      Json result = expr.kind == ExprKind::kList ? Json::array() : Json::object();
      for (size_t i = 0; i < operands.size(); ++i) {
        const Value item = eval(*operands[i], scope);
        if (expr.kind == ExprKind::kList) {
          result.push_back(item.to_element());
          continue;
        }
        if (!item.is_string()) raise("dict keys must be strings, got ", type_name(item));
        result[item.string()] = eval(*operands[++i], scope).to_element();
      }
      return Value(std::move(result));
    }
    case ExprKind::kAttribute:
      return get_attribute(eval(*operands[0], scope), expr.name);
    case ExprKind::kItem: {
      const Value object = eval(*operands[0], scope);
      const Expr& key = *operands[1];
      if (key.kind != ExprKind::kSlice) return get_item(object, eval(key, scope));
      const auto bound = [&](size_t i) {
        return key.operands[i] ? eval(*key.operands[i], scope) : Value(Json(nullptr));
      };
      return get_slice(object, bound(0), bound(1), bound(2));
    }
    case ExprKind::kSlice:
      raise("a slice is only valid inside []");
    case ExprKind::kCall:
      return eval_call(expr, scope);
    case ExprKind::kFilter:
      return eval_filter(expr, scope, nullptr);
    case ExprKind::kTest:
      return boolean(apply_test(expr.name, eval(*operands[0], scope), eval_args(expr, 1, scope)));
    case ExprKind::kUnary:
      return unary_op(expr.op, eval(*operands[0], scope));
    case ExprKind::kBinary:
      return binary_op(expr.op, eval(*operands[0], scope), eval(*operands[1], scope));
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      Value left = eval(*operands[0], scope);
      const bool decided = truthy(left) == (expr.kind == ExprKind::kOr);
      return decided ? left : eval(*operands[1], scope);
    }
    case ExprKind::kCompare: {
      Value left = eval(*operands[0], scope);
      for (size_t i = 0; i < expr.ops.size(); ++i) {
        Value right = eval(*operands[i + 1], scope);
        if (!compare_op(expr.ops[i], left, right)) return boolean(false);
        left = std::move(right);
      }
      return boolean(true);
    }
    case ExprKind::kConcat: {
      std::string text;
      for (const auto& operand : operands) text += to_str(eval(*operand, scope));
      return Value(Json(std::move(text)));
    }
    case ExprKind::kCondition:
      if (truthy(eval(*operands[1], scope))) return eval(*operands[0], scope);
      if (operands[2]) return eval(*operands[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and has no else");
  }
  raise("unsupported expression");
}

Value Renderer::eval_call(const Expr& expr, const std::shared_ptr<Scope>& scope) {
  const Value callee = eval(*expr.operands[0], scope);
  if (!callee.is_defined()) raise(callee.undefined_message());
  if (callee.kind() != ValueKind::kCallable)
    raise("'", type_name(callee), "' object is not callable");
  const CallArgs args = eval_args(expr, 1, scope);
  const Callable& callable = callee.callable();
  if (callable.builtin == Builtin::kMacro) return call_macro(callable, args);
  return call_builtin(callable, args);
}

Value Renderer::eval_filter(const Expr& filter, const std::shared_ptr<Scope>& scope,
                            const Value* input) {
  Value subject;
  const Expr* inner = filter.operands[0].get();
  if (inner == nullptr) {
    subject = *input;
  } else if (input != nullptr && inner->kind == ExprKind::kFilter) {
    subject = eval_filter(*inner, scope, input);
  } else {
    subject = eval(*inner, scope);
  }
  try {
    return apply_filter(filter.name, subject, eval_args(filter, 1, scope));
  } catch (const Unpositioned& e) {
    fail(describe(filter.position), ": ", e.what());
  }
}

CallArgs Renderer::eval_args(const Expr& expr, size_t first, const std::shared_ptr<Scope>& scope) {
  CallArgs args;
  for (size_t i = first; i < expr.operands.size(); ++i) {
    args.positional.push_back(eval(*expr.operands[i], scope));
  }
  for (const auto& keyword : expr.keywords) {
    args.keywords.emplace_back(keyword.name, eval(*keyword.value, scope));
  }
  return args;
}

Value Renderer::call_macro(const Callable& macro, const CallArgs& args) {
  const Stmt& stmt = *macro.macro;
  if (args.positional.size() > stmt.params.size()) {
    raise("macro '", macro.name, "' takes not more than ", stmt.params.size(), " argument(s)");
  }
  auto frame = std::make_shared<Scope>();
  frame->parent = macro.closure;
  std::vector<bool> bound(stmt.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    frame->set(stmt.params[i], args.positional[i]);
    bound[i] = true;
  }
  for (const auto& [name, value] : args.keywords) {
    size_t i = 0;
    while (i < stmt.params.size() && stmt.params[i] != name) ++i;
    if (i == stmt.params.size()) raise("macro '", macro.name, "' has no argument '", name, "'");
    if (bound[i]) raise("macro '", macro.name, "' got multiple values for argument '", name, "'");
    frame->set(name, value);
    bound[i] = true;
  }
  for (size_t i = 0; i < stmt.params.size(); ++i) {
    if (bound[i]) continue;
    frame->set(stmt.params[i], stmt.defaults[i]
                                   ? eval(*stmt.defaults[i], frame)
                                   : Value::undefined("'" + stmt.params[i] + "' is undefined"));
  }
  if (++macro_depth_ > kMaxMacroDepth) raise("macro calls nested too deeply");
  std::string out;
  exec(stmt.body, frame, out);
  --macro_depth_;
  return Value(Json(std::move(out)));
}

}  // namespace nibble::jinja
