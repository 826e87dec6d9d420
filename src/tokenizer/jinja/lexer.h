// Splits template source into tokens: literal text, the delimiters of {{ }} and {% %}, and the
// expression tokens inside them. Whitespace control happens here, as in Jinja's own lexer, with
// the options transformers compiles chat templates with: trim_blocks=True (drop the newline
// after %} and #}), lstrip_blocks=True (drop spaces and tabs before {% and {# on their line),
// keep_trailing_newline=False, and "-" / "+" on either side of a tag.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja {

struct Token {
  enum class Kind {
    text,          // literal template text (value: the text)
    print_begin,   // {{
    print_end,     // }}
    block_begin,   // {%
    block_end,     // %}
    name,          // identifiers and keywords (if, for, in, and, not, ...)
    string,        // value: the decoded string
    integer,       // value: the digits, underscores removed
    floating,      // value: the literal, underscores removed
    op,            // value: the operator, e.g. "==", "//", "(", "|"
    end,           // end of the source
  };
  Kind kind;
  std::string value;
  int line;
};

// Throws kiln::Error(invalid_argument) for unterminated tags, comments and strings and for
// characters that start no token.
std::vector<Token> tokenize(std::string_view source);

}  // namespace kiln::jinja
