// Jinja lexer (see jinja_lexer.h). Follows jinja2.lexer's rules: newlines are normalized to \n and
// one trailing newline is dropped; "{%-" strips all whitespace before the tag, "-%}" all after it;
// otherwise lstrip_blocks removes spaces between a line start and "{%"/"{#", and trim_blocks
// removes one newline after "%}"/"#}". Literals are read by jinja_literals.cc.
#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenizer/jinja_pystr.h"
#include "tokenizer/jinja_value.h"
#include "tokenizer/utf8.h"

namespace nibble::jinja {
namespace {

constexpr std::array<std::string_view, 26> kOperators = {
    "**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
    "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    bool line_starting = true;  // the previous tag ended a line (or nothing came before)
    while (pos_ < src_.size()) {
      const size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        text(src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      std::string before = src_.substr(pos_, start - pos_);
      if (sign == '-') {
        before = strip(before, std::nullopt, StripSide::kRight);
      } else if (sign != '+' && kind != '{') {
        const size_t line_start = before.rfind('\n') + 1;  // 0 when there is none
        if ((line_start > 0 || line_starting) && line_start < before.size() &&
            all_space(std::string_view(before).substr(line_start))) {
          before.resize(line_start);
        }
      }
      text(before, pos_);
      pos_ = start + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (kind == '#') {
        skip_comment(start);
      } else if (kind == '%' && raw_block(start)) {
      } else {
        tag(kind == '{' ? TokenKind::kVariableBegin : TokenKind::kBlockBegin, start);
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back({TokenKind::kEnd, "", position(src_.size())});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& message) const {
    fail(describe(position(at)), ": ", message);
  }

  Position position(size_t at) const {
    at = std::min(at, src_.size());
    const auto line = std::upper_bound(line_starts_.begin(), line_starts_.end(), at) - 1;
    Position p;
    p.line = static_cast<int>(line - line_starts_.begin()) + 1;
    p.column =
        static_cast<int>(code_point_count(std::string_view(src_).substr(*line, at - *line))) + 1;
    return p;
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  static bool all_space(std::string_view s) {
    for (size_t pos = 0; pos < s.size();) {
      if (!is_space(utf8::next_char(s, pos))) return false;
    }
    return true;
  }

  // Length of the whitespace run at `at` (Python's \s*).
  size_t space_run(size_t at) const {
    size_t end = at;
    while (end < src_.size()) {
      size_t next = end;
      if (!is_space(utf8::next_char(src_, next))) break;
      end = next;
    }
    return end - at;
  }

  bool starts(size_t at, std::string_view s) const { return src_.compare(at, s.size(), s) == 0; }

  void text(std::string s, size_t at) {
    if (!s.empty()) tokens_.push_back({TokenKind::kText, std::move(s), position(at)});
  }

  // Where a tag closing with `close` ("%}", "#}", "}}") ends, handling "-" and "+" and
  // trim_blocks (`trim`), or npos when `at` does not start one.
  size_t closing(size_t at, std::string_view close, bool trim) const {
    if (starts(at, "-") && starts(at + 1, close)) {
      const size_t end = at + 1 + close.size();
      return end + space_run(end);
    }
    if (close != "}}" && starts(at, "+") && starts(at + 1, close)) return at + 1 + close.size();
    if (starts(at, close)) {
      const size_t end = at + close.size();
      return trim && end < src_.size() && src_[end] == '\n' ? end + 1 : end;
    }
    return std::string::npos;
  }

  void skip_comment(size_t start) {
    for (size_t i = pos_; i < src_.size(); ++i) {
      const size_t end = closing(i, "#}", true);
      if (end != std::string::npos) {
        pos_ = end;
        return;
      }
    }
    if (pos_ < src_.size())
      error(start, "missing end of comment tag");  // a bare trailing "{#" is dropped
    pos_ = src_.size();
  }

  // "{% raw %}...{% endraw %}": the body is text, with the whitespace rules of the endraw tag.
  bool raw_block(size_t start) {
    size_t at = pos_ + space_run(pos_);
    if (!starts(at, "raw")) return false;
    at += 3;
    at += space_run(at);
    size_t body = std::string::npos;
    if (starts(at, "-%}")) {
      body = at + 3 + space_run(at + 3);
    } else if (starts(at, "%}")) {
      body = at + 2;  // no trim_blocks newline after raw (as in Jinja)
    }
    if (body == std::string::npos) return false;
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      const char sign = i + 2 < src_.size() ? src_[i + 2] : '\0';
      size_t k = i + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      k += space_run(k);
      if (!starts(k, "endraw")) continue;
      k += 6;
      k += space_run(k);
      const size_t end = closing(k, "%}", true);
      if (end == std::string::npos) continue;
      std::string content = src_.substr(body, i - body);
      if (sign == '-') {
        content = strip(content, std::nullopt, StripSide::kRight);
      } else if (sign != '+') {
        const size_t line_start = content.rfind('\n') + 1;
        if (line_start > 0 && line_start < content.size() &&
            all_space(std::string_view(content).substr(line_start))) {
          content.resize(line_start);
        }
      }
      text(std::move(content), body);
      pos_ = end;
      return true;
    }
    error(start, "missing end of raw directive");
  }

  void tag(TokenKind begin, size_t start) {
    tokens_.push_back({begin, "", position(start)});
    const bool is_block = begin == TokenKind::kBlockBegin;
    std::vector<char> brackets;
    while (true) {
      if (pos_ >= src_.size()) error(start, "unexpected end of template inside a tag");
      if (brackets.empty()) {
        const size_t end = closing(pos_, is_block ? "%}" : "}}", is_block);
        if (end != std::string::npos) {
          tokens_.push_back(
              {is_block ? TokenKind::kBlockEnd : TokenKind::kVariableEnd, "", position(pos_)});
          pos_ = end;
          return;
        }
      }
      const size_t spaces = space_run(pos_);
      if (spaces > 0) {
        pos_ += spaces;
        continue;
      }
      if (literal() || name()) continue;
      operator_token(brackets);
    }
  }

  bool name() {
    if (!is_name_start(src_[pos_])) return false;
    const size_t begin = pos_;
    while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
    tokens_.push_back({TokenKind::kName, src_.substr(begin, pos_ - begin), position(begin)});
    return true;
  }

  bool literal() {
    std::optional<Literal> literal;
    try {
      literal = read_number(src_, pos_);
      if (!literal) literal = read_string(src_, pos_);
    } catch (const Unpositioned& e) {
      error(pos_, e.what());
    }
    if (!literal) return false;
    tokens_.push_back({literal->kind, std::move(literal->text), position(pos_)});
    pos_ = literal->end;
    return true;
  }

  void operator_token(std::vector<char>& brackets) {
    for (const std::string_view op : kOperators) {
      if (!starts(pos_, op)) continue;
      if (op == "(" || op == "[" || op == "{") {
        brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (brackets.empty()) error(pos_, cat("unexpected '", op, "'"));
        if (brackets.back() != op[0]) {
          error(pos_, cat("unexpected '", op, "', expected '", brackets.back(), "'"));
        }
        brackets.pop_back();
      }
      tokens_.push_back({TokenKind::kOperator, std::string(op), position(pos_)});
      pos_ += op.size();
      return;
    }
    size_t next = pos_;
    const char32_t c = utf8::next_char(src_, next);
    std::string shown;
    utf8::append(shown, c);
    error(pos_, cat("unexpected character '", shown, "'"));
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

// Jinja's source preparation: \r\n and \r become \n, and one trailing newline is dropped.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(normalize_newlines(source)).run();
}

std::string describe(const Position& position) {
  return cat("line ", position.line, ", column ", position.column);
}

}  // namespace nibble::jinja
