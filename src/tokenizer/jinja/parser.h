// Template source -> syntax tree, by recursive descent with Jinja's operator precedence
// (lowest first): a if b else c, or, and, not, comparisons and in, + -, ~, * / // %, **,
// unary - +, then postfix . [] () and filters | and tests "is".
#pragma once

#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace kiln::jinja {

// Throws kiln::Error: invalid_argument for syntax errors, unsupported for Jinja constructs kiln
// does not implement (both name the line).
Body parse_template(std::string_view source);

}  // namespace kiln::jinja
