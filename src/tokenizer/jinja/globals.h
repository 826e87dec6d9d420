// The global functions transformers defines for chat templates (raise_exception, strftime_now,
// namespace, dict) and Jinja's own range.
#pragma once

#include <map>
#include <string>

#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

// Jinja's sandbox caps range() at this many items (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

// Adds the globals to `scope` (without replacing variables the caller already set).
void add_globals(std::map<std::string, Value>& scope);

}  // namespace kiln::jinja
