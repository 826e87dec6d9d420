// Jinja's built-in filters and tests and the Python methods templates call on strings, dicts and
// lists, with the semantics transformers' environment gives them (tojson is its json.dumps
// override). Each one reports misuse as kiln::Error naming the template line.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

// Known names, checked when the template is parsed: Jinja rejects an unknown filter or test at
// compile time even in a branch that never runs, and so does kiln.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args, int line);
bool apply_test(const std::string& name, const Value& subject, const CallArgs& args, int line);
Value call_method(const Value& object, const std::string& method, const CallArgs& args, int line);

// `value` as Python's json.dumps(value, ensure_ascii, indent, separators, sort_keys) writes it.
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // one level of indentation; absent: one line (indent=None)
  std::string item_separator, key_separator;  // empty: json.dumps' defaults for the indent mode
  bool sort_keys = false;
};
std::string to_json(const Value& value, const JsonOptions& options, int line);

}  // namespace kiln::jinja
