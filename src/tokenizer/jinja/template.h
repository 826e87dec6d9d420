// A parsed Jinja template and its interpreter: the subset of Jinja2 that Hugging Face chat
// templates use, rendered the way transformers renders them (apply_chat_template with
// tokenize=False). src/tokenizer/jinja/README.md lists what is and is not supported.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

class Template {
 public:
  // Parses `source`. Throws kiln::Error: invalid_argument for syntax errors, unsupported for
  // Jinja features kiln lacks; both name the line.
  explicit Template(std::string_view source);

  // Renders with `variables` in scope, besides the globals transformers gives chat templates:
  // raise_exception(msg), strftime_now(fmt), namespace(...), range(...), dict(...).
  // raise_exception throws kiln::Error(invalid_argument) carrying the template's message; other
  // runtime errors (undefined values used, type errors) are invalid_argument too.
  std::string render(const std::map<std::string, Value>& variables) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace kiln::jinja
