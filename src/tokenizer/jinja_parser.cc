// Jinja statement parsing: text, {{ }} output, and the tags if/elif/else, for (with else, an `if`
// filter and unpacking), set (plain, namespace attribute, block), break/continue (loopcontrols),
// macro, filter, with, print and Hugging Face's generation. Expressions: jinja_parse_expr.cc.
#include <algorithm>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_parser.h"

namespace nibble::jinja {
namespace {

// Jinja checks filter and test names when it compiles a template, except inside {% if %} and
// inline if-expressions ("soft" frames), where an unknown name only fails if it runs. Loop,
// macro, with and block bodies start a new frame, which is not soft.
void check_names(const Expr* expr, bool soft) {
  if (expr == nullptr) return;
  soft = soft || expr->kind == ExprKind::kCondition;
  if (!soft && expr->kind == ExprKind::kFilter && !is_filter(expr->name)) {
    fail(describe(expr->position), ": unknown filter '", expr->name, "'");
  }
  if (!soft && expr->kind == ExprKind::kTest && !is_test(expr->name)) {
    fail(describe(expr->position), ": unknown test '", expr->name, "'");
  }
  for (const auto& operand : expr->operands) check_names(operand.get(), soft);
  for (const auto& keyword : expr->keywords) check_names(keyword.value.get(), soft);
}

void check_names(const Body& body, bool soft) {
  for (const auto& stmt : body) {
    const bool is_if = stmt->kind == StmtKind::kIf;
    const bool inline_expr = stmt->kind == StmtKind::kOutput || stmt->kind == StmtKind::kSet ||
                             stmt->kind == StmtKind::kFor || stmt->kind == StmtKind::kWith;
    check_names(stmt->expr.get(), inline_expr ? soft : false);
    check_names(stmt->condition.get(), false);
    for (const auto& branch : stmt->branches) {
      check_names(branch.condition.get(), true);
      check_names(branch.body, true);
    }
    for (const auto& value : stmt->defaults) {
      check_names(value.get(), stmt->kind == StmtKind::kWith ? soft : false);
    }
    check_names(stmt->body, is_if && soft);
    check_names(stmt->else_body, false);
  }
}

}  // namespace

Body parse(std::string_view source) {
  Body body = Parser(tokenize(source)).parse_template();
  check_names(body, false);
  return body;
}

std::string describe_token(const Token& token) {
  switch (token.kind) {
    case TokenKind::kText:
      return "template text";
    case TokenKind::kVariableBegin:
      return "begin of print statement";
    case TokenKind::kVariableEnd:
      return "end of print statement";
    case TokenKind::kBlockBegin:
      return "begin of statement block";
    case TokenKind::kBlockEnd:
      return "end of statement block";
    case TokenKind::kString:
      return "string";
    case TokenKind::kInteger:
      return "integer";
    case TokenKind::kFloat:
      return "float";
    case TokenKind::kEnd:
      return "end of template";
    default:
      return "'" + token.text + "'";
  }
}

Body Parser::parse_template() {
  Body body = subparse({});
  if (current().kind != TokenKind::kEnd) unexpected("end of template");
  return body;
}

Body Parser::subparse(std::initializer_list<std::string_view> end_tags) {
  Body body;
  while (true) {
    const Token& token = current();
    if (token.kind == TokenKind::kEnd) {
      if (end_tags.size() > 0) {
        std::string expected;
        for (const auto tag : end_tags)
          expected += (expected.empty() ? "'" : " or '") + std::string(tag) + "'";
        error(token.position, "unexpected end of template, expected " + expected);
      }
      return body;
    }
    if (token.kind == TokenKind::kText) {
      auto stmt = std::make_unique<Stmt>();
      stmt->kind = StmtKind::kText;
      stmt->position = token.position;
      stmt->text = token.text;
      body.push_back(std::move(stmt));
      advance();
    } else if (token.kind == TokenKind::kVariableBegin) {
      auto stmt = std::make_unique<Stmt>();
      stmt->kind = StmtKind::kOutput;
      stmt->position = advance().position;
      stmt->expr = parse_tuple();
      expect(TokenKind::kVariableEnd);
      body.push_back(std::move(stmt));
    } else if (token.kind == TokenKind::kBlockBegin) {
      const Token& tag = peek();
      if (tag.kind == TokenKind::kName &&
          std::find(end_tags.begin(), end_tags.end(), tag.text) != end_tags.end()) {
        advance();  // leaves the end tag's name current
        return body;
      }
      advance();
      body.push_back(statement());
    } else {
      unexpected("template text or a tag");
    }
  }
}

// The body of a block statement whose header ends here: consumes the block end, then parses until
// one of `end_tags`, leaving that tag's name current.
Body Parser::statements(std::initializer_list<std::string_view> end_tags) {
  skip_op(":");
  expect(TokenKind::kBlockEnd);
  return subparse(end_tags);
}

void Parser::end_tag(std::string_view name) {
  if (!is_name(name)) unexpected("'" + std::string(name) + "'");
  advance();
  expect(TokenKind::kBlockEnd);
}

std::unique_ptr<Stmt> Parser::statement() {
  const Token& token = current();
  if (token.kind != TokenKind::kName) error(token.position, "tag name expected");
  const Position position = token.position;
  const std::string name = advance().text;
  if (name == "if") return parse_if(position);
  if (name == "for") return parse_for(position);
  if (name == "set") return parse_set(position);
  if (name == "macro") return parse_macro(position);
  if (name == "with") return parse_with(position);
  if (name == "filter") return parse_filter_block(position);
  auto stmt = std::make_unique<Stmt>();
  stmt->position = position;
  if (name == "break" || name == "continue") {
    if (loop_depth_ == 0) error(position, "'" + name + "' outside of a for loop");
    stmt->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    expect(TokenKind::kBlockEnd);
  } else if (name == "print") {
    stmt->kind = StmtKind::kOutput;
    stmt->expr = parse_tuple();
    expect(TokenKind::kBlockEnd);
  } else if (name == "generation") {
    stmt->kind = StmtKind::kScope;
    stmt->body = statements({"endgeneration"});
    end_tag("endgeneration");
  } else {
    error(position, "unknown or unsupported tag '" + name + "'");
  }
  return stmt;
}

std::unique_ptr<Stmt> Parser::parse_if(Position position) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kIf;
  stmt->position = position;
  while (true) {
    Branch branch;
    branch.condition = parse_tuple(/*with_condition=*/false);
    branch.body = statements({"elif", "else", "endif"});
    stmt->branches.push_back(std::move(branch));
    const std::string tag = advance().text;
    if (tag == "elif") continue;
    if (tag == "else") {
      Branch otherwise;
      otherwise.body = statements({"endif"});
      stmt->branches.push_back(std::move(otherwise));
      end_tag("endif");
    } else {
      expect(TokenKind::kBlockEnd);
    }
    return stmt;
  }
}

std::unique_ptr<Stmt> Parser::parse_for(Position position) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kFor;
  stmt->position = position;
  stmt->target = parse_target(/*with_namespace=*/false);
  if (!skip_name("in")) unexpected("'in'");
  stmt->expr = parse_tuple(/*with_condition=*/false, "recursive");
  if (skip_name("if")) stmt->condition = parse_expression();
  if (is_name("recursive")) error(current().position, "recursive loops are not supported");
  ++loop_depth_;
  stmt->body = statements({"endfor", "else"});
  --loop_depth_;
  if (advance().text == "else") {
    stmt->else_body = statements({"endfor"});
    end_tag("endfor");
  } else {
    expect(TokenKind::kBlockEnd);
  }
  return stmt;
}

std::unique_ptr<Stmt> Parser::parse_set(Position position) {
  auto stmt = std::make_unique<Stmt>();
  stmt->position = position;
  stmt->target = parse_target(/*with_namespace=*/true);
  if (skip_op("=")) {
    stmt->kind = StmtKind::kSet;
    stmt->expr = parse_tuple();
    expect(TokenKind::kBlockEnd);
    return stmt;
  }
  stmt->kind = StmtKind::kSetBlock;
  if (is_op("|")) stmt->expr = parse_filter(nullptr);
  stmt->body = statements({"endset"});
  end_tag("endset");
  return stmt;
}

std::unique_ptr<Stmt> Parser::parse_macro(Position position) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kMacro;
  stmt->position = position;
  stmt->target.names.push_back(expect_name().text);
  expect_op("(");
  while (!is_op(")")) {
    if (!stmt->params.empty()) expect_op(",");
    if (is_op(")")) break;
    stmt->params.push_back(expect_name().text);
    if (skip_op("=")) {
      stmt->defaults.push_back(parse_expression());
    } else {
      if (!stmt->defaults.empty() && stmt->defaults.back()) {
        error(current().position, "non-default argument follows default argument");
      }
      stmt->defaults.push_back(nullptr);
    }
  }
  expect_op(")");
  const int outer_loops = loop_depth_;
  loop_depth_ = 0;
  stmt->body = statements({"endmacro"});
  loop_depth_ = outer_loops;
  end_tag("endmacro");
  return stmt;
}

std::unique_ptr<Stmt> Parser::parse_with(Position position) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kWith;
  stmt->position = position;
  while (current().kind != TokenKind::kBlockEnd) {
    if (!stmt->params.empty()) expect_op(",");
    stmt->params.push_back(expect_name().text);
    expect_op("=");
    stmt->defaults.push_back(parse_expression());
  }
  stmt->body = statements({"endwith"});
  end_tag("endwith");
  return stmt;
}

std::unique_ptr<Stmt> Parser::parse_filter_block(Position position) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kFilterBlock;
  stmt->position = position;
  stmt->expr = parse_filter(nullptr, /*start_inline=*/true);
  stmt->body = statements({"endfilter"});
  end_tag("endfilter");
  return stmt;
}

Target Parser::parse_target(bool with_namespace) {
  Target target;
  target.names.push_back(expect_name().text);
  if (with_namespace && skip_op(".")) {
    target.attribute = expect_name().text;
    return target;
  }
  while (skip_op(",")) {
    if (current().kind != TokenKind::kName || current().text == "in") break;
    target.names.push_back(expect_name().text);
  }
  for (const auto& name : target.names) {
    if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
        name == "None") {
      error(current().position, "cannot assign to '" + name + "'");
    }
  }
  return target;
}

const Token& Parser::peek(size_t ahead) const {
  return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
}

bool Parser::is_op(std::string_view op) const {
  return current().kind == TokenKind::kOperator && current().text == op;
}

bool Parser::is_name(std::string_view name) const {
  return current().kind == TokenKind::kName && current().text == name;
}

bool Parser::skip_op(std::string_view op) {
  if (!is_op(op)) return false;
  advance();
  return true;
}

bool Parser::skip_name(std::string_view name) {
  if (!is_name(name)) return false;
  advance();
  return true;
}

const Token& Parser::expect_op(std::string_view op) {
  if (!is_op(op)) unexpected("'" + std::string(op) + "'");
  return advance();
}

const Token& Parser::expect_name() {
  if (current().kind != TokenKind::kName) unexpected("a name");
  return advance();
}

const Token& Parser::expect(TokenKind kind) {
  if (current().kind != kind) unexpected(describe_token(Token{kind, "", {}}));
  return advance();
}

bool Parser::at_tag_end() const {
  return current().kind == TokenKind::kVariableEnd || current().kind == TokenKind::kBlockEnd ||
         is_op(")");
}

void Parser::error(const Position& position, const std::string& message) const {
  fail(describe(position), ": ", message);
}

void Parser::unexpected(const std::string& expected) const {
  error(current().position, "expected " + expected + ", got " + describe_token(current()));
}

}  // namespace nibble::jinja
