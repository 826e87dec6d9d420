// The syntax tree of a parsed template: expressions and statements. One node type per family,
// with a kind and the fields that kind uses (documented on each kind), keeps the interpreter a
// pair of switch statements.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,      // value
    name,         // name
    list,         // operands: the items
    tuple,        // operands: the items
    dict,         // operands: key0, value0, key1, value1, ...
    attribute,    // operands[0].name
    subscript,    // operands[0][operands[1]]
    slice,        // operands[0][operands[1]:operands[2]:operands[3]] (absent parts are null)
    call,         // operands[0](operands[1..], keywords)
    filter,       // operands[0] | name(operands[1..], keywords)
    test,         // operands[0] is [not] name(operands[1..]); negated for "is not"
    unary,        // name ("not", "-", "+") applied to operands[0]
    binary,       // operands[0] name operands[1]; name is an operator, "and", "or", "in", "not in"
    compare,      // operands[0] ops[0] operands[1] ops[1] operands[2] ... (chained, as in Python)
    conditional,  // operands[0] if operands[1] else operands[2] (else part may be null)
  };
  Kind kind;
  int line;
  Value value;
  std::string name;
  std::vector<ExprPtr> operands;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    text,         // text: literal output
    print,        // {{ expr }}
    if_,          // branches (condition, body) in order; else_body
    for_,         // for targets in expr [if condition]: body; else_body when nothing was iterated
    set,          // {% set targets = expr %}, or {% set object.attribute = expr %}
    set_block,    // {% set targets[0] %}body{% endset %}
    macro,        // {% macro name(params) %}body{% endmacro %}
    break_,       //
    continue_,    //
    block,        // body rendered in place: {% generation %} (transformers' assistant-mask tag)
  };
  struct Branch {
    ExprPtr condition;
    Body body;
  };
  struct Param {
    std::string name;
    ExprPtr default_value;  // null when the caller must pass it
  };

  Kind kind;
  int line;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;                 // for_: the loop filter
  std::vector<std::string> targets;  // for_/set: names to bind; set: one name when attribute is set
  std::string object, attribute;     // set: {% set object.attribute = ... %}
  std::vector<Branch> branches;
  Body body, else_body;
  std::string name;  // macro
  std::vector<Param> params;
};

}  // namespace kiln::jinja
