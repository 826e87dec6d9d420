// The expression half of the chat-template parser: recursive descent with Jinja's operator
// precedence (lowest first): a if b else c, or, and, not, comparisons and in, + -, ~, * / // %, **,
// unary - +, then postfix . [] () and filters | and tests "is". parser.cpp's statements build on it.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/token_cursor.h"

namespace kiln::jinja {

// Deeper nesting than any real template, shallow enough that recursion cannot exhaust the stack.
constexpr int kMaxNesting = 200;

class ExpressionParser : protected TokenCursor {
 public:
  explicit ExpressionParser(std::vector<Token> tokens) : TokenCursor(std::move(tokens)) {}

 protected:
  struct NestingGuard {
    explicit NestingGuard(ExpressionParser& p) : p(p) {
      KILN_CHECK(++p.nesting_ <= kMaxNesting, unsupported, "chat template line {}: nested more than {} levels deep",
                 p.current().line, kMaxNesting);
    }
    ~NestingGuard() { --p.nesting_; }
    ExpressionParser& p;
  };

  static ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  bool at_tuple_end() const {
    const Token& t = current();
    return t.kind == K::print_end || t.kind == K::block_end || (t.kind == K::op && t.value == ")");
  }

  // Comma-separated expressions: one alone is itself, several are a tuple ("{% set a = 1, 2 %}").
  ExprPtr parse_tuple(bool with_condexpr, bool in_parentheses = false) {
    const int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (at_tuple_end()) break;
      items.push_back(with_condexpr ? parse_expression() : parse_or());
      if (at_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !in_parentheses) fail_expected("an expression");
    auto e = node(Expr::Kind::tuple, line);
    e->operands = std::move(items);
    return e;
  }

  ExprPtr parse_expression() {
    NestingGuard guard(*this);
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      const int line = advance().line;
      auto e = node(Expr::Kind::conditional, line);
      ExprPtr condition = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression() : nullptr;
      e->operands.push_back(std::move(expr));
      e->operands.push_back(std::move(condition));
      e->operands.push_back(std::move(otherwise));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = node(Expr::Kind::binary, line);
    e->name = std::move(op);
    e->operands.push_back(std::move(left));
    e->operands.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      const int line = advance().line;
      left = binary("or", std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      const int line = advance().line;
      left = binary("and", std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      NestingGuard guard(*this);
      auto e = node(Expr::Kind::unary, advance().line);
      e->name = "not";
      e->operands.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = current().line;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    for (;;) {
      static const std::string_view kComparisons[] = {"==", "!=", "<", ">", "<=", ">="};
      if (current().kind == K::op &&
          std::find(std::begin(kComparisons), std::end(kComparisons), current().value) != std::end(kComparisons)) {
        ops.push_back(advance().value);
      } else if (at_name("in")) {
        advance();
        ops.push_back("in");
      } else if (at_name("not") && peek().kind == K::name && peek().value == "in") {
        advance();
        advance();
        ops.push_back("not in");
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = node(Expr::Kind::compare, line);
    e->operands.push_back(std::move(first));
    for (auto& r : rest) e->operands.push_back(std::move(r));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& t = advance();
      left = binary(t.value, std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      const int line = advance().line;
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& t = advance();
      left = binary(t.value, std::move(left), parse_pow(), t.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      const int line = advance().line;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    NestingGuard guard(*this);
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const Token& t = advance();
      e = node(Expr::Kind::unary, t.line);
      e->name = t.value;
      e->operands.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters_and_tests(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    const int line = t.line;
    switch (t.kind) {
      case K::name: {
        advance();
        auto e = node(Expr::Kind::literal, line);
        if (t.value == "true" || t.value == "True") {
          e->value = true;
        } else if (t.value == "false" || t.value == "False") {
          e->value = false;
        } else if (t.value == "none" || t.value == "None") {
          e->value = None{};
        } else {
          e->kind = Expr::Kind::name;
          e->name = t.value;
        }
        return e;
      }
      case K::string: {
        std::string s;
        while (current().kind == K::string) s += advance().value;  // adjacent literals concatenate
        auto e = node(Expr::Kind::literal, line);
        e->value = std::move(s);
        return e;
      }
      case K::integer: {
        auto e = node(Expr::Kind::literal, line);
        errno = 0;
        const long long v = std::strtoll(t.value.c_str(), nullptr, 10);
        KILN_CHECK(errno == 0, unsupported, "chat template line {}: the integer {} is too large", line, t.value);
        e->value = int64_t(v);
        advance();
        return e;
      }
      case K::floating: {
        auto e = node(Expr::Kind::literal, line);
        e->value = std::strtod(t.value.c_str(), nullptr);
        advance();
        return e;
      }
      case K::op:
        if (t.value == "(") {
          advance();
          ExprPtr e = parse_tuple(true, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default: break;
    }
    fail_expected("an expression");
  }

  ExprPtr parse_list() {
    auto e = node(Expr::Kind::list, advance().line);
    while (!at_op("]")) {
      if (!e->operands.empty()) expect_op(",");
      if (at_op("]")) break;
      e->operands.push_back(parse_expression());
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = node(Expr::Kind::dict, advance().line);
    while (!at_op("}")) {
      if (!e->operands.empty()) expect_op(",");
      if (at_op("}")) break;
      e->operands.push_back(parse_expression());
      expect_op(":");
      e->operands.push_back(parse_expression());
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (at_op(".") || at_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters_and_tests(ExprPtr e) {
    for (;;) {
      if (at_op("|")) {
        e = parse_filter(std::move(e));
      } else if (at_name("is")) {
        e = parse_test(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const Token& t = advance();
    if (t.value == ".") {
      if (current().kind == K::integer) {  // x.0 is x[0]
        auto e = node(Expr::Kind::subscript, t.line);
        e->operands.push_back(std::move(object));
        auto index = node(Expr::Kind::literal, t.line);
        index->value = int64_t(std::strtoll(advance().value.c_str(), nullptr, 10));
        e->operands.push_back(std::move(index));
        return e;
      }
      auto e = node(Expr::Kind::attribute, t.line);
      e->name = expect_name();
      e->operands.push_back(std::move(object));
      return e;
    }
    // [index] or [start:stop:step]
    ExprPtr start;
    if (!at_op(":")) {
      start = parse_expression();
      if (!at_op(":")) {
        KILN_CHECK(!at_op(","), unsupported, "chat template line {}: tuple subscripts x[a, b] are not supported",
                   t.line);
        expect_op("]");
        auto e = node(Expr::Kind::subscript, t.line);
        e->operands.push_back(std::move(object));
        e->operands.push_back(std::move(start));
        return e;
      }
    }
    expect_op(":");
    ExprPtr stop, step;
    if (!at_op(":") && !at_op("]")) stop = parse_expression();
    if (skip_op(":") && !at_op("]")) step = parse_expression();
    expect_op("]");
    auto e = node(Expr::Kind::slice, t.line);
    e->operands.push_back(std::move(object));
    e->operands.push_back(std::move(start));
    e->operands.push_back(std::move(stop));
    e->operands.push_back(std::move(step));
    return e;
  }

  // Arguments of a call, filter or test, from "(" to ")", into e->operands (after the subject)
  // and e->keywords.
  void parse_call_arguments(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!at_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (at_op(")")) break;
      KILN_CHECK(!at_op("*") && !at_op("**"), unsupported,
                 "chat template line {}: *args and **kwargs in calls are not supported", current().line);
      if (current().kind == K::name && peek().kind == K::op && peek().value == "=") {
        std::string key = advance().value;
        advance();
        e.keywords.emplace_back(std::move(key), parse_expression());
      } else {
        KILN_CHECK(e.keywords.empty(), invalid_argument,
                   "chat template line {}: a positional argument follows a keyword argument", current().line);
        e.operands.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(Expr::Kind::call, current().line);
    e->operands.push_back(std::move(callee));
    parse_call_arguments(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr subject) {
    const int line = advance().line;  // '|'
    auto e = node(Expr::Kind::filter, line);
    e->name = expect_name();
    KILN_CHECK(!at_op("."), unsupported, "chat template line {}: dotted filter names are not supported", line);
    KILN_CHECK(is_known_filter(e->name), unsupported,
               "chat template line {}: the filter '{}' is not supported by kiln's Jinja interpreter", line, e->name);
    e->operands.push_back(std::move(subject));
    if (at_op("(")) parse_call_arguments(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr subject) {
    const int line = advance().line;  // 'is'
    auto e = node(Expr::Kind::test, line);
    e->negated = skip_name("not");
    e->name = expect_name();
    KILN_CHECK(is_known_test(e->name), unsupported,
               "chat template line {}: the test '{}' is not supported by kiln's Jinja interpreter", line, e->name);
    e->operands.push_back(std::move(subject));
    if (at_op("(")) {
      parse_call_arguments(*e);
    } else {
      // One argument without parentheses: "x is divisibleby 3", "x is sameas false".
      const Token& t = current();
      const bool starts_argument = t.kind == K::name || t.kind == K::string || t.kind == K::integer ||
                                   t.kind == K::floating || (t.kind == K::op && (t.value == "[" || t.value == "{"));
      if (starts_argument && !at_name("else") && !at_name("or") && !at_name("and")) {
        KILN_CHECK(!at_name("is"), invalid_argument, "chat template line {}: tests cannot be chained with 'is'", line);
        e->operands.push_back(parse_postfix(parse_primary()));
      }
    }
    return e;
  }

  int nesting_ = 0;
};

}  // namespace kiln::jinja
