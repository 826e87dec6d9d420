// Binds the arguments of a call to a Python-style parameter list, so each filter, test and method
// reads its parameters by position whether the template passed them positionally or by keyword
// ("x | tojson(indent=2)", "join(', ')").
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

class BoundArgs {
 public:
  // `what` names the callee in errors ("filter 'join'"). Extra positional arguments and unknown
  // keywords are errors, as they are in Python.
  BoundArgs(const CallArgs& args, std::string what, int line, std::initializer_list<std::string_view> params)
      : what_(std::move(what)), line_(line), values_(params.size()), given_(params.size(), false) {
    KILN_CHECK(args.positional.size() <= params.size(), invalid_argument,
               "chat template line {}: {} takes at most {} argument(s), got {}", line, what_, params.size(),
               args.positional.size());
    for (size_t i = 0; i < args.positional.size(); ++i) {
      values_[i] = args.positional[i];
      given_[i] = true;
    }
    for (const auto& [key, value] : args.keyword) {
      size_t i = 0;
      for (auto p : params) {
        if (p == key) break;
        ++i;
      }
      KILN_CHECK(i < params.size(), invalid_argument, "chat template line {}: {} got an unexpected keyword argument '{}'",
                 line, what_, key);
      KILN_CHECK(!given_[i], invalid_argument, "chat template line {}: {} got multiple values for argument '{}'", line,
                 what_, key);
      values_[i] = value;
      given_[i] = true;
    }
  }

  bool has(size_t i) const { return given_[i]; }
  const Value& get(size_t i) const { return values_[i]; }
  Value get_or(size_t i, Value fallback) const { return given_[i] ? values_[i] : std::move(fallback); }

  // Typed accessors: a wrong type is an error naming the parameter's position.
  std::string string(size_t i) const {
    KILN_CHECK(values_[i].is_string(), invalid_argument, "chat template line {}: {} expects a string argument, got {}",
               line_, what_, values_[i].type_name());
    return values_[i].as_string();
  }
  int64_t integer(size_t i) const {
    KILN_CHECK(values_[i].is_int() || values_[i].is_bool(), invalid_argument,
               "chat template line {}: {} expects an integer argument, got {}", line_, what_, values_[i].type_name());
    return values_[i].to_int();
  }
  void require(size_t i, std::string_view name) const {
    KILN_CHECK(given_[i], invalid_argument, "chat template line {}: {} is missing its argument '{}'", line_, what_,
               name);
  }

 private:
  std::string what_;
  int line_;
  std::vector<Value> values_;
  std::vector<bool> given_;
};

}  // namespace kiln::jinja
