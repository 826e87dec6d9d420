#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "core/check.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/lexer.h"

namespace kiln::jinja {
namespace {

using K = Token::Kind;

// Deeper nesting than any real template, shallow enough that recursion cannot exhaust the stack.
constexpr int kMaxNesting = 200;

// Tags that are Jinja but not kiln: named in the error so the reader knows it is a gap, not a typo.
constexpr std::string_view kUnsupportedTags[] = {"call", "filter", "with", "include", "import", "from",
                                                 "extends", "block", "autoescape", "do", "trans"};

std::string describe(const Token& t) {
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

// Tags that only continue or close a block: meeting one where it closes nothing is an error.
bool is_closing_tag(std::string_view name) {
  return name == "elif" || name == "else" || name.substr(0, 3) == "end";
}

std::string quoted_list(std::initializer_list<std::string_view> names) {
  std::string out;
  for (auto n : names) out += (out.empty() ? "'" : " or '") + std::string(n) + "'";
  return out;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  // ---- token stream -------------------------------------------------------------------------
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

  struct NestingGuard {
    explicit NestingGuard(Parser& p) : p(p) {
      KILN_CHECK(++p.nesting_ <= kMaxNesting, unsupported, "chat template line {}: nested more than {} levels deep",
                 p.current().line, kMaxNesting);
    }
    ~NestingGuard() { --p.nesting_; }
    Parser& p;
  };

  static ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  static StmtPtr stmt(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // ---- statements ---------------------------------------------------------------------------

  // Statements up to a {% name %} tag whose name is in `ends` (consumed up to and including the
  // name, which is stored in *found), or up to the end of the template when `ends` is empty.
  Body parse_body(std::initializer_list<std::string_view> ends, std::string* found) {
    NestingGuard guard(*this);
    Body body;
    for (;;) {
      const Token& t = current();
      if (t.kind == K::end) {
        if (ends.size() == 0) return body;
        KILN_FAIL(invalid_argument, "chat template line {}: unexpected end of template, expected {}", t.line,
                  quoted_list(ends));
      }
      if (t.kind == K::text) {
        auto s = stmt(Stmt::Kind::text, t.line);
        s->text = advance().value;
        body.push_back(std::move(s));
      } else if (t.kind == K::print_begin) {
        advance();
        auto s = stmt(Stmt::Kind::print, t.line);
        s->expr = parse_tuple(true);
        expect(K::print_end, "'}}'");
        body.push_back(std::move(s));
      } else if (t.kind == K::block_begin) {
        const Token& keyword = peek();
        if (keyword.kind == K::name && std::find(ends.begin(), ends.end(), keyword.value) != ends.end()) {
          advance();
          *found = advance().value;
          return body;
        }
        KILN_CHECK(keyword.kind != K::name || !is_closing_tag(keyword.value), invalid_argument,
                   "chat template line {}: unexpected {{% {} %}}{}", keyword.line, keyword.value,
                   ends.size() ? ", expected " + quoted_list(ends) : std::string());
        advance();
        body.push_back(parse_statement());
      } else {
        fail_expected("template text or a tag");
      }
    }
  }

  StmtPtr parse_statement() {
    const int line = current().line;
    if (current().kind != K::name) fail_expected("a tag name");
    const std::string keyword = advance().value;
    if (keyword == "if") return parse_if(line);
    if (keyword == "for") return parse_for(line);
    if (keyword == "set") return parse_set(line);
    if (keyword == "macro") return parse_macro(line);
    if (keyword == "break" || keyword == "continue") {
      KILN_CHECK(loop_depth_ > 0, invalid_argument, "chat template line {}: {{% {} %}} outside a for loop", line,
                 keyword);
      expect(K::block_end, "'%}'");
      return stmt(keyword == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, line);
    }
    if (keyword == "generation") {
      expect(K::block_end, "'%}'");
      auto s = stmt(Stmt::Kind::block, line);
      std::string end;
      s->body = parse_body({"endgeneration"}, &end);
      expect(K::block_end, "'%}'");
      return s;
    }
    if (std::find(std::begin(kUnsupportedTags), std::end(kUnsupportedTags), keyword) != std::end(kUnsupportedTags))
      KILN_FAIL(unsupported, "chat template line {}: the {{% {} %}} tag is not supported by kiln's Jinja interpreter",
                line, keyword);
    KILN_FAIL(unsupported, "chat template line {}: unknown tag {{% {} %}}", line, keyword);
  }

  StmtPtr parse_if(int line) {
    auto s = stmt(Stmt::Kind::if_, line);
    std::string end = "if";
    while (end == "if" || end == "elif") {
      Stmt::Branch branch;
      branch.condition = parse_tuple(false);
      expect(K::block_end, "'%}'");
      branch.body = parse_body({"elif", "else", "endif"}, &end);
      s->branches.push_back(std::move(branch));
    }
    if (end == "else") {
      expect(K::block_end, "'%}'");
      s->else_body = parse_body({"endif"}, &end);
    }
    expect(K::block_end, "'%}'");
    return s;
  }

  StmtPtr parse_for(int line) {
    auto s = stmt(Stmt::Kind::for_, line);
    do {
      s->targets.push_back(expect_name());
    } while (skip_op(","));
    if (!skip_name("in")) fail_expected("'in'");
    s->expr = parse_tuple(false);
    KILN_CHECK(!at_name("recursive"), unsupported, "chat template line {}: recursive for loops are not supported",
               line);
    if (skip_name("if")) s->condition = parse_expression();
    expect(K::block_end, "'%}'");
    ++loop_depth_;
    std::string end;
    s->body = parse_body({"endfor", "else"}, &end);
    --loop_depth_;
    if (end == "else") {
      expect(K::block_end, "'%}'");
      s->else_body = parse_body({"endfor"}, &end);
    }
    expect(K::block_end, "'%}'");
    return s;
  }

  StmtPtr parse_set(int line) {
    auto s = stmt(Stmt::Kind::set, line);
    const std::string first = expect_name();
    if (skip_op(".")) {
      s->object = first;
      s->attribute = expect_name();
    } else {
      s->targets.push_back(first);
      while (skip_op(",")) s->targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      s->expr = parse_tuple(true);
      expect(K::block_end, "'%}'");
      return s;
    }
    KILN_CHECK(!at_op("|"), unsupported, "chat template line {}: filters on {{% set %}} blocks are not supported",
               line);
    KILN_CHECK(s->object.empty() && s->targets.size() == 1, invalid_argument,
               "chat template line {}: a {{% set %}} block assigns exactly one name", line);
    expect(K::block_end, "'=' or '%}'");
    s->kind = Stmt::Kind::set_block;
    std::string end;
    s->body = parse_body({"endset"}, &end);
    expect(K::block_end, "'%}'");
    return s;
  }

  StmtPtr parse_macro(int line) {
    auto s = stmt(Stmt::Kind::macro, line);
    s->name = expect_name();
    expect_op("(");
    while (!at_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (at_op(")")) break;
      Stmt::Param p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression();
      s->params.push_back(std::move(p));
    }
    expect_op(")");
    expect(K::block_end, "'%}'");
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;  // {% break %} cannot leave a macro
    std::string end;
    s->body = parse_body({"endmacro"}, &end);
    loop_depth_ = saved_loop_depth;
    skip_name(s->name);  // Jinja allows {% endmacro name %}
    expect(K::block_end, "'%}'");
    return s;
  }

  // ---- expressions --------------------------------------------------------------------------

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

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(tokenize(source)).parse_all(); }

}  // namespace kiln::jinja
