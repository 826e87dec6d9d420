// A cursor over the lexer's tokens, with the small look/consume/expect vocabulary the parser's
// grammar functions are written in. Syntax errors name the line and what was found instead.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "tokenizer/jinja/lexer.h"

namespace kiln::jinja {

using K = Token::Kind;

// How a token reads in an error message ("'}}'", "a string literal", "the end of the template").
inline std::string describe(const Token& t) {
  switch (t.kind) {
    case K::text: return "template text";
    case K::print_begin: return "'{{'";
    case K::print_end: return "'}}'";
    case K::block_begin: return "'{%'";
    case K::block_end: return "'%}'";
    case K::name: return "'" + t.value + "'";
    case K::string: return "a string literal";
    case K::integer:
    case K::floating: return "the number " + t.value;
    case K::op: return "'" + t.value + "'";
    case K::end: return "the end of the template";
  }
  return "a token";
}

class TokenCursor {
 public:
  explicit TokenCursor(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& advance() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool at_op(std::string_view op) const { return current().kind == K::op && current().value == op; }
  bool at_name(std::string_view name) const { return current().kind == K::name && current().value == name; }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }
  [[noreturn]] void fail_expected(std::string_view what) const {
    KILN_FAIL(invalid_argument, "chat template line {}: expected {}, got {}", current().line, what,
              describe(current()));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_expected("'" + std::string(op) + "'");
  }
  void expect(K kind, std::string_view what) {
    if (current().kind != kind) fail_expected(what);
    advance();
  }
  std::string expect_name() {
    if (current().kind != K::name) fail_expected("a name");
    return advance().value;
  }

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

}  // namespace kiln::jinja
