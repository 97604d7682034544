// Lexer of nibble's Jinja2 subset: splits a template into text and the tokens of {{ }} and {% %}
// tags, applying whitespace control the way Jinja's lexer does with trim_blocks=True and
// lstrip_blocks=True (the Hugging Face chat-template settings), plus {%- -%} and {%+ +%}.
// Comments are dropped; {% raw %} bodies become text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::jinja {

struct Position {
  int line = 1;
  int column = 1;
};

enum class TokenKind : uint8_t {
  kText,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,   // text: the unescaped value
  kInteger,  // text: digits without '_'
  kFloat,    // text: digits without '_'
  kOperator,
  kEnd,  // end of template
};

struct Token {
  TokenKind kind;
  std::string text;
  Position position;
};

// Raises nibble::Error naming the line and column for unterminated tags, comments and strings,
// and characters that start no token.
std::vector<Token> tokenize(std::string_view source);

std::string describe(const Position& position);  // "line 3, column 14"

// A number or string literal starting at s[at] (jinja_literals.cc): its token kind, value
// (unescaped string; digits without '_', integers in decimal) and end. nullopt when s[at] starts
// neither; raises jinja::Unpositioned for malformed ones.
struct Literal {
  TokenKind kind;
  std::string text;
  size_t end;
};
std::optional<Literal> read_number(std::string_view s, size_t at);
std::optional<Literal> read_string(std::string_view s, size_t at);

}  // namespace nibble::jinja
