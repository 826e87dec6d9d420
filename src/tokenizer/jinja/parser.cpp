#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>

#include "core/check.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/expression_parser.h"

namespace kiln::jinja {
namespace {

// Tags that are Jinja but not kiln: named in the error so the reader knows it is a gap, not a typo.
constexpr std::string_view kUnsupportedTags[] = {"call", "filter", "with", "include", "import", "from",
                                                 "extends", "block", "autoescape", "do", "trans"};

// Tags that only continue or close a block: meeting one where it closes nothing is an error.
bool is_closing_tag(std::string_view name) {
  return name == "elif" || name == "else" || name.substr(0, 3) == "end";
}

std::string quoted_list(std::initializer_list<std::string_view> names) {
  std::string out;
  for (auto n : names) out += (out.empty() ? "'" : " or '") + std::string(n) + "'";
  return out;
}

// The statements ({% if %}, {% for %}, ...) over the expression grammar.
class Parser : ExpressionParser {
 public:
  explicit Parser(std::vector<Token> tokens) : ExpressionParser(std::move(tokens)) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
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

  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(tokenize(source)).parse_all(); }

}  // namespace kiln::jinja
