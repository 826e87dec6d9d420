// Python's operators on template values, as Jinja evaluates them: arithmetic, comparison,
// membership, attribute and item access, slicing, iteration. Type errors say what Python would
// say ("unsupported operand type(s) for +: 'str' and 'int'") with the template line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

// Throws kiln::Error(invalid_argument) for a value of `bytes` past kMaxValueBytes.
void check_value_size(size_t bytes, int line);

// str.replace (and the replace filter) within kMaxValueBytes: the result grows with the matches, so
// it is checked as it is built.
std::string bounded_replace(std::string_view s, std::string_view old, std::string_view with, int64_t count, int line);

// 64-bit integers where Python's are unbounded: a result past them throws kiln::Error(unsupported)
// instead of wrapping around (or, in C++, being undefined).
[[noreturn]] void fail_int_overflow(int line);
int64_t int_from_double(double d, int line);  // int(x): truncated
int64_t int_negate(int64_t x, int line);

// Using an Undefined for anything but printing, testing and iterating is an error, as with
// Jinja's default Undefined. Throws kiln::Error(invalid_argument).
[[noreturn]] void fail_undefined(const Undefined& u, int line);
[[noreturn]] void fail_type(int line, const std::string& message);

// op is one of + - * / // % ** ~
Value binary_op(const std::string& op, const Value& a, const Value& b, int line);
// op is one of == != < > <= >= in "not in"
bool compare_op(const std::string& op, const Value& a, const Value& b, int line);

// x.name: a dict's item or a namespace's attribute; Undefined when absent.
Value get_attribute(const Value& object, const std::string& name, int line);
// x[key]: Python indexing (negative indices count from the end); Undefined when absent.
Value get_item(const Value& object, const Value& key, int line);
Value get_slice(const Value& object, std::optional<int64_t> start, std::optional<int64_t> stop,
                std::optional<int64_t> step, int line);

// What a for loop visits: list items, dict keys, the characters of a string; nothing for Undefined.
std::vector<Value> iterate(const Value& v, int line);

}  // namespace kiln::jinja
