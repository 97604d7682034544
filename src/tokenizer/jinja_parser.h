// Parser of nibble's Jinja2 subset: tokens to the syntax tree of jinja_ast.h, following jinja2's
// grammar and operator precedence. Statements live in jinja_parser.cc, expressions in
// jinja_parse_expr.cc. Unknown tags are errors at parse time; so are unknown filters and tests,
// except inside {% if %} and inline ifs, where (as in Jinja) they fail only when reached.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_ast.h"

namespace nibble::jinja {

// Raises nibble::Error naming the line and column of the first syntax error.
Body parse(std::string_view source);

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}
  Body parse_template();

 private:
  // Statements.
  Body subparse(std::initializer_list<std::string_view> end_tags);
  Body statements(std::initializer_list<std::string_view> end_tags);
  std::unique_ptr<Stmt> statement();
  std::unique_ptr<Stmt> parse_if(Position position);
  std::unique_ptr<Stmt> parse_for(Position position);
  std::unique_ptr<Stmt> parse_set(Position position);
  std::unique_ptr<Stmt> parse_macro(Position position);
  std::unique_ptr<Stmt> parse_with(Position position);
  std::unique_ptr<Stmt> parse_filter_block(Position position);
  Target parse_target(bool with_namespace);
  void end_tag(std::string_view name);  // consumes `name` and the block end

  // Expressions, from the loosest binding to the tightest.
  ExprPtr parse_tuple(bool with_condition = true, std::string_view extra_end = {},
                      bool explicit_parentheses = false);
  ExprPtr parse_expression(bool with_condition = true);
  ExprPtr parse_condition();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  ExprPtr parse_filter(ExprPtr node, bool start_inline = false);
  ExprPtr parse_test(ExprPtr node);
  void parse_call_args(Expr& call);

  // Token stream.
  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const;
  const Token& advance() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(std::string_view op) const;
  bool is_name(std::string_view name) const;
  bool skip_op(std::string_view op);
  bool skip_name(std::string_view name);
  const Token& expect_op(std::string_view op);
  const Token& expect_name();
  const Token& expect(TokenKind kind);
  bool at_tag_end() const;
  [[noreturn]] void error(const Position& position, const std::string& message) const;
  [[noreturn]] void unexpected(const std::string& expected) const;

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;  // break/continue are only valid inside a for body
};

// Token as shown in syntax errors: "'foo'", "end of statement block"...
std::string describe_token(const Token& token);

}  // namespace nibble::jinja
