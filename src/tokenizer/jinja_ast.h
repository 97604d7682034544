// Syntax tree of nibble's Jinja2 subset, as built by jinja_parser and walked by jinja_render.
// One node type for expressions and one for statements, each using the fields its kind names;
// a parsed tree is immutable and shared by every render (renders may run concurrently).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_value.h"

namespace nibble::jinja {

enum class ExprKind : uint8_t {
  kLiteral,    // literal
  kName,       // name
  kList,       // operands: items
  kDict,       // operands: key, value, key, value...
  kAttribute,  // operands[0].name
  kItem,       // operands[0][operands[1]]; operands[1] may be a kSlice
  kSlice,      // operands: start, stop, step (each may be null)
  kCall,       // operands[0](operands[1:], keywords)
  kFilter,     // operands[0] | name(operands[1:], keywords); operands[0] null in {% filter %}
  kTest,       // operands[0] is name(operands[1:], keywords)
  kUnary,      // op operands[0]
  kBinary,     // operands[0] op operands[1]
  kAnd,        // operands[0] and operands[1]
  kOr,         // operands[0] or operands[1]
  kCompare,    // operands[0] ops[0] operands[1] ops[1] operands[2]...
  kConcat,     // operands joined with ~
  kCondition,  // operands[0] if operands[1] else operands[2] (may be null)
};

enum class Op : uint8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,  // binary arithmetic
  kNeg,
  kPos,
  kNot,  // unary
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kIn,
  kNotIn,  // comparisons
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  Position position;
  Json literal;
  std::string name;
  Op op = Op::kAdd;
  std::vector<Op> ops;
  std::vector<ExprPtr> operands;
  std::vector<Keyword> keywords;
};

enum class StmtKind : uint8_t {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches (the else branch has no condition)
  kFor,       // for target in expr [if condition]: body, else: else_body
  kSet,       // set target = expr
  kSetBlock,  // set target [| expr filters] body endset
  kBreak,
  kContinue,
  kMacro,        // macro target.names[0](params = defaults): body
  kFilterBlock,  // filter expr: body (expr is a kFilter chain whose innermost subject is null)
  kWith,         // with params = defaults: body
  kScope,        // body rendered as is ({% generation %}, which Hugging Face adds)
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

// Assignment target: `x`, `a, b` (unpacking), or `ns.attr` (namespace attribute).
struct Target {
  std::vector<std::string> names;
  std::string attribute;  // non-empty for ns.attr
};

struct Branch {
  ExprPtr condition;  // null for else
  Body body;
};

struct Stmt {
  StmtKind kind;
  Position position;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  Target target;
  std::vector<Branch> branches;
  Body body;
  Body else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned with params; null where there is no default
};

}  // namespace nibble::jinja
