// Jinja expression parsing, mirroring jinja2.parser's precedence: inline if < or < and < not <
// comparisons (==, in, not in...) < + - < ~ < * / // % < ** < unary - + < postfix (. [] ()) and
// filters/tests (| is). Tuples become lists; *args and **kwargs are not supported.
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_parser.h"

namespace nibble::jinja {
namespace {

ExprPtr node(ExprKind kind, Position position) {
  auto expr = std::make_unique<Expr>();
  expr->kind = kind;
  expr->position = position;
  return expr;
}

ExprPtr binary(ExprKind kind, Op op, ExprPtr left, ExprPtr right, Position position) {
  auto expr = node(kind, position);
  expr->op = op;
  expr->operands.push_back(std::move(left));
  expr->operands.push_back(std::move(right));
  return expr;
}

}  // namespace

ExprPtr Parser::parse_tuple(bool with_condition, std::string_view extra_end,
                            bool explicit_parentheses) {
  const Position position = current().position;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (at_tag_end() || (!extra_end.empty() && is_name(extra_end))) break;
    items.push_back(parse_expression(with_condition));
    if (is_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parentheses) unexpected("an expression");
  }
  auto tuple = node(ExprKind::kList, position);
  tuple->operands = std::move(items);
  return tuple;
}

ExprPtr Parser::parse_expression(bool with_condition) {
  return with_condition ? parse_condition() : parse_or();
}

ExprPtr Parser::parse_condition() {
  ExprPtr expr = parse_or();
  while (is_name("if")) {
    const Position position = advance().position;
    auto condition = node(ExprKind::kCondition, position);
    condition->operands.push_back(std::move(expr));
    condition->operands.push_back(parse_or());
    condition->operands.push_back(skip_name("else") ? parse_condition() : nullptr);
    expr = std::move(condition);
  }
  return expr;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const Position position = advance().position;
    left = binary(ExprKind::kOr, Op::kAdd, std::move(left), parse_and(), position);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const Position position = advance().position;
    left = binary(ExprKind::kAnd, Op::kAdd, std::move(left), parse_not(), position);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (!is_name("not")) return parse_compare();
  auto expr = node(ExprKind::kUnary, advance().position);
  expr->op = Op::kNot;
  expr->operands.push_back(parse_not());
  return expr;
}

ExprPtr Parser::parse_compare() {
  const Position position = current().position;
  ExprPtr first = parse_math1();
  ExprPtr compare;
  while (true) {
    Op op;
    if (is_op("=="))
      op = Op::kEq;
    else if (is_op("!="))
      op = Op::kNe;
    else if (is_op("<"))
      op = Op::kLt;
    else if (is_op("<="))
      op = Op::kLe;
    else if (is_op(">"))
      op = Op::kGt;
    else if (is_op(">="))
      op = Op::kGe;
    else if (is_name("in"))
      op = Op::kIn;
    else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in")
      op = Op::kNotIn;
    else
      break;
    advance();
    if (op == Op::kNotIn) advance();
    if (!compare) {
      compare = node(ExprKind::kCompare, position);
      compare->operands.push_back(std::move(first));
    }
    compare->ops.push_back(op);
    compare->operands.push_back(parse_math1());
  }
  return compare ? std::move(compare) : std::move(first);
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Op op = current().text == "+" ? Op::kAdd : Op::kSub;
    const Position position = advance().position;
    left = binary(ExprKind::kBinary, op, std::move(left), parse_concat(), position);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  const Position position = current().position;
  ExprPtr first = parse_math2();
  if (!is_op("~")) return first;
  auto concat = node(ExprKind::kConcat, position);
  concat->operands.push_back(std::move(first));
  while (skip_op("~")) concat->operands.push_back(parse_math2());
  return concat;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const std::string& text = current().text;
    const Op op = text == "*"    ? Op::kMul
                  : text == "/"  ? Op::kDiv
                  : text == "//" ? Op::kFloorDiv
                                 : Op::kMod;
    const Position position = advance().position;
    left = binary(ExprKind::kBinary, op, std::move(left), parse_pow(), position);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary();
  while (is_op("**")) {
    const Position position = advance().position;
    left = binary(ExprKind::kBinary, Op::kPow, std::move(left), parse_unary(), position);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  ExprPtr expr;
  if (is_op("-") || is_op("+")) {
    const Op op = current().text == "-" ? Op::kNeg : Op::kPos;
    expr = node(ExprKind::kUnary, advance().position);
    expr->op = op;
    expr->operands.push_back(parse_unary(/*with_filter=*/false));
  } else {
    expr = parse_primary();
  }
  expr = parse_postfix(std::move(expr));
  return with_filter ? parse_filter_expr(std::move(expr)) : std::move(expr);
}

ExprPtr Parser::parse_primary() {
  const Token& token = current();
  ExprPtr expr;
  if (token.kind == TokenKind::kName) {
    expr = node(ExprKind::kLiteral, token.position);
    if (token.text == "true" || token.text == "True") {
      expr->literal = true;
    } else if (token.text == "false" || token.text == "False") {
      expr->literal = false;
    } else if (token.text == "none" || token.text == "None") {
      expr->literal = nullptr;
    } else {
      expr->kind = ExprKind::kName;
      expr->name = token.text;
    }
    advance();
  } else if (token.kind == TokenKind::kString) {
    expr = node(ExprKind::kLiteral, token.position);
    std::string text;
    while (current().kind == TokenKind::kString) text += advance().text;
    expr->literal = std::move(text);
  } else if (token.kind == TokenKind::kInteger || token.kind == TokenKind::kFloat) {
    expr = node(ExprKind::kLiteral, token.position);
    try {
      if (token.kind == TokenKind::kInteger) {
        expr->literal = static_cast<int64_t>(std::stoll(token.text));
      } else {
        expr->literal = std::stod(token.text);
      }
    } catch (const std::exception&) {
      error(token.position, "number out of range: " + token.text);
    }
    advance();
  } else if (is_op("(")) {
    advance();
    expr = parse_tuple(/*with_condition=*/true, {}, /*explicit_parentheses=*/true);
    expect_op(")");
  } else if (is_op("[") || is_op("{")) {
    const bool is_dict = current().text == "{";
    const std::string close = is_dict ? "}" : "]";
    expr = node(is_dict ? ExprKind::kDict : ExprKind::kList, advance().position);
    while (!is_op(close)) {
      if (!expr->operands.empty()) expect_op(",");
      if (is_op(close)) break;
      expr->operands.push_back(parse_expression());
      if (is_dict) {
        expect_op(":");
        expr->operands.push_back(parse_expression());
      }
    }
    expect_op(close);
  } else {
    error(token.position, "unexpected " + describe_token(token));
  }
  return expr;
}

ExprPtr Parser::parse_postfix(ExprPtr expr) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      expr = parse_subscript(std::move(expr));
    } else if (is_op("(")) {
      auto call = node(ExprKind::kCall, expr->position);
      call->operands.push_back(std::move(expr));
      parse_call_args(*call);
      expr = std::move(call);
    } else {
      return expr;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr expr) {
  while (true) {
    if (is_op("|")) {
      expr = parse_filter(std::move(expr));
    } else if (is_name("is")) {
      expr = parse_test(std::move(expr));
    } else if (is_op("(")) {
      auto call = node(ExprKind::kCall, expr->position);
      call->operands.push_back(std::move(expr));
      parse_call_args(*call);
      expr = std::move(call);
    } else {
      return expr;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr object) {
  const Position position = object->position;  // errors point at where the chain starts
  const Token& token = advance();
  if (token.text == ".") {
    const Token& attribute = current();
    if (attribute.kind == TokenKind::kName) {
      auto expr = node(ExprKind::kAttribute, position);
      expr->name = advance().text;
      expr->operands.push_back(std::move(object));
      return expr;
    }
    if (attribute.kind != TokenKind::kInteger) unexpected("a name or number");
    auto expr = node(ExprKind::kItem, position);
    expr->operands.push_back(std::move(object));
    expr->operands.push_back(parse_primary());
    return expr;
  }
  auto expr = node(ExprKind::kItem, position);
  expr->operands.push_back(std::move(object));
  auto key = node(ExprKind::kList, current().position);  // x[a, b] and x[] index with a tuple
  while (!is_op("]")) {
    if (!key->operands.empty()) expect_op(",");
    key->operands.push_back(parse_subscribed());
  }
  expect_op("]");
  expr->operands.push_back(key->operands.size() == 1 ? std::move(key->operands[0])
                                                     : std::move(key));
  return expr;
}

ExprPtr Parser::parse_subscribed() {
  const Position position = current().position;
  ExprPtr start;
  if (!is_op(":")) {
    start = parse_expression();
    if (!is_op(":")) return start;
  }
  advance();  // the first ':'
  auto slice = node(ExprKind::kSlice, position);
  slice->operands.push_back(std::move(start));
  const auto bound = [&]() -> ExprPtr {
    if (is_op(":") || is_op("]") || is_op(",")) return nullptr;
    return parse_expression();
  };
  slice->operands.push_back(bound());
  slice->operands.push_back(skip_op(":") ? bound() : nullptr);
  return slice;
}

void Parser::parse_call_args(Expr& call) {
  expect_op("(");
  bool first = true;
  while (!is_op(")")) {
    if (!first) {
      expect_op(",");
      if (is_op(")")) break;
    }
    first = false;
    if (is_op("*") || is_op("**"))
      error(current().position, "*args and **kwargs are not supported");
    if (current().kind == TokenKind::kName && peek().kind == TokenKind::kOperator &&
        peek().text == "=") {
      Keyword keyword;
      keyword.name = advance().text;
      advance();
      keyword.value = parse_expression();
      call.keywords.push_back(std::move(keyword));
    } else {
      if (!call.keywords.empty())
        error(current().position, "positional argument follows keyword argument");
      call.operands.push_back(parse_expression());
    }
  }
  expect_op(")");
}

ExprPtr Parser::parse_filter(ExprPtr subject, bool start_inline) {
  while (is_op("|") || start_inline) {
    if (!start_inline) advance();
    start_inline = false;
    const Token& name = expect_name();
    if (is_op(".")) error(current().position, "dotted filter names are not supported");
    auto filter = node(ExprKind::kFilter, name.position);
    filter->name = name.text;
    filter->operands.push_back(std::move(subject));
    if (is_op("(")) parse_call_args(*filter);
    subject = std::move(filter);
  }
  return subject;
}

ExprPtr Parser::parse_test(ExprPtr subject) {
  advance();  // 'is'
  const bool negated = skip_name("not");
  const Token& name = expect_name();
  const Position position = name.position;
  if (is_op(".")) error(current().position, "dotted test names are not supported");
  auto test = node(ExprKind::kTest, position);
  test->name = name.text;
  test->operands.push_back(std::move(subject));
  const Token& next = current();
  if (is_op("(")) {
    parse_call_args(*test);
  } else if ((next.kind == TokenKind::kName && next.text != "else" && next.text != "or" &&
              next.text != "and") ||
             next.kind == TokenKind::kString || next.kind == TokenKind::kInteger ||
             next.kind == TokenKind::kFloat || is_op("[") || is_op("{")) {
    if (is_name("is")) error(next.position, "cannot chain multiple tests with 'is'");
    test->operands.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return test;
  auto negation = node(ExprKind::kUnary, position);
  negation->op = Op::kNot;
  negation->operands.push_back(std::move(test));
  return negation;
}

}  // namespace nibble::jinja
