#include "tokenizer/jinja/operators.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "tokenizer/jinja/py_string.h"

namespace kiln::jinja {

void fail_undefined(const Undefined& u, int line) {
  KILN_FAIL(invalid_argument, "chat template line {}: {}", line, u.reason);
}

void fail_type(int line, const std::string& message) {
  KILN_FAIL(invalid_argument, "chat template line {}: {}", line, message);
}

void check_value_size(size_t bytes, int line) {
  KILN_CHECK(bytes <= kMaxValueBytes, invalid_argument, "chat template line {}: a value grew past {} MiB", line,
             kMaxValueBytes >> 20);
}

[[noreturn]] static void fail_operands(const std::string& op, const Value& a, const Value& b, int line) {
  fail_type(line, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
}

// What a copy of l's items allocates: the items, and the text of the strings among them (strings
// are held by value, lists and dicts by reference).
static size_t copied_bytes(const List& l) {
  size_t bytes = l.items.size() * sizeof(Value);
  for (const Value& v : l.items)
    if (v.is_string()) bytes += v.as_string().size();
  return bytes;
}

static Value repeat(const Value& seq, int64_t times, int line) {
  // The size is checked before it is multiplied (a product past 2^64 would wrap to a small one) and
  // an empty sequence is done at once (the loop would otherwise run `times` empty appends).
  const size_t unit = seq.is_string() ? seq.as_string().size() : copied_bytes(seq.as_list());
  if (times <= 0 || unit == 0) return seq.is_string() ? Value(std::string()) : Value::list({}, seq.as_list().is_tuple);
  check_value_size(uint64_t(times) > kMaxValueBytes / unit ? kMaxValueBytes + 1 : unit * size_t(times), line);
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return out;
  }
  const List& l = seq.as_list();
  std::vector<Value> items;
  for (int64_t i = 0; i < times; ++i) items.insert(items.end(), l.items.begin(), l.items.end());
  return Value::list(std::move(items), l.is_tuple);
}

std::string bounded_replace(std::string_view s, std::string_view old, std::string_view with, int64_t count, int line) {
  std::optional<std::string> out = py::replace(s, old, with, count, kMaxValueBytes);
  if (!out) check_value_size(kMaxValueBytes + 1, line);
  return std::move(*out);
}

[[noreturn]] void fail_int_overflow(int line) {
  // Python integers never overflow; kiln's are 64-bit, so say so rather than wrap around.
  KILN_FAIL(unsupported, "chat template line {}: integer arithmetic beyond 64 bits is not supported", line);
}

int64_t int_from_double(double d, int line) {
  // Python's int(x) truncates; a value outside int64_t has no 64-bit result (and casting it is
  // undefined behaviour in C++).
  const double t = std::trunc(d);
  if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0)) fail_int_overflow(line);
  return int64_t(t);
}

int64_t int_negate(int64_t x, int line) {
  if (x == std::numeric_limits<int64_t>::min()) fail_int_overflow(line);
  return -x;
}

// x ** y for y >= 0 by squaring, failing on the first product past 64 bits (a squaring is only
// done when a later bit of y needs it, so its overflow means the result's).
static int64_t int_power(int64_t x, int64_t y, int line) {
  int64_t result = 1, base = x;
  while (y > 0) {
    if ((y & 1) && __builtin_mul_overflow(result, base, &result)) fail_int_overflow(line);
    y >>= 1;
    if (y > 0 && __builtin_mul_overflow(base, base, &base)) fail_int_overflow(line);
  }
  return result;
}

static Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  const bool floating = a.is_float() || b.is_float();
  if (op == "/") {
    KILN_CHECK(b.to_double() != 0.0, invalid_argument, "chat template line {}: division by zero", line);
    return a.to_double() / b.to_double();
  }
  if (floating) {
    const double x = a.to_double(), y = b.to_double();
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (op == "**") return std::pow(x, y);
    KILN_CHECK(y != 0.0, invalid_argument, "chat template line {}: float division by zero", line);
    if (op == "//") return std::floor(x / y);
    double r = std::fmod(x, y);  // "%": the result takes the divisor's sign, as in Python
    if (r != 0.0 && ((r < 0) != (y < 0))) r += y;
    return r;
  }
  const int64_t x = a.to_int(), y = b.to_int();
  int64_t r;
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) fail_int_overflow(line);
    return r;
  }
  if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) fail_int_overflow(line);
    return r;
  }
  if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) fail_int_overflow(line);
    return r;
  }
  if (op == "**") {
    if (y < 0) return std::pow(double(x), double(y));
    return int_power(x, y, line);
  }
  KILN_CHECK(y != 0, invalid_argument, "chat template line {}: integer division or modulo by zero", line);
  if (x == std::numeric_limits<int64_t>::min() && y == -1) {  // the one quotient past 64 bits
    if (op == "//") fail_int_overflow(line);
    return int64_t(0);
  }
  if (op == "//") {
    int64_t q = x / y;
    if (x % y != 0 && ((x < 0) != (y < 0))) --q;
    return q;
  }
  r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}

Value binary_op(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    check_value_size(s.size(), line);
    return s;
  }
  if (a.is_undefined()) fail_undefined(a.as_undefined(), line);
  if (b.is_undefined()) fail_undefined(b.as_undefined(), line);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b, line);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_value_size(a.as_string().size() + b.as_string().size(), line);
      return a.as_string() + b.as_string();
    }
    if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
      check_value_size(copied_bytes(a.as_list()) + copied_bytes(b.as_list()), line);
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::list(std::move(items), a.as_list().is_tuple);
    }
    if (a.is_string() && !b.is_string())
      fail_type(line, fmt::format("can only concatenate str (not \"{}\") to str", b.type_name()));
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.to_int(), line);
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.to_int(), line);
  }
  KILN_CHECK(!(op == "%" && a.is_string()), unsupported,
             "chat template line {}: printf-style string formatting ('...' % x) is not supported", line);
  fail_operands(op, a, b, line);
}

// Python's ordering for <, >, <=, >=: numbers, strings (by code point, which UTF-8 byte order
// preserves) and sequences (lexicographically); anything else is a TypeError.
static int order(const Value& a, const Value& b, const std::string& op, int line) {
  if (a.is_undefined()) fail_undefined(a.as_undefined(), line);
  if (b.is_undefined()) fail_undefined(b.as_undefined(), line);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.to_double(), y = b.to_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.to_int() < b.to_int() ? -1 : a.to_int() > b.to_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return order(x[i], y[i], op, line);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail_type(line, fmt::format("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(),
                              b.type_name()));
}

static bool contains(const Value& container, const Value& item, int line) {
  if (container.is_string()) {
    if (item.is_undefined()) fail_undefined(item.as_undefined(), line);
    if (!item.is_string())
      fail_type(line, fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.as_list().items)
      if (equals(v, item)) return true;
    return false;
  }
  if (container.is_mapping()) return container.as_dict().find(item) != nullptr;
  if (container.is_undefined()) return false;  // Undefined iterates as empty
  fail_type(line, fmt::format("argument of type '{}' is not iterable", container.type_name()));
}

bool compare_op(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a, line);
  if (op == "not in") return !contains(b, a, line);
  const int c = order(a, b, op, line);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

Value get_attribute(const Value& object, const std::string& name, int line) {
  if (object.is_undefined()) fail_undefined(object.as_undefined(), line);
  if (object.is_dict()) {
    if (const Value* v = object.as_dict().find(Value(name))) return *v;
  }
  return Undefined{fmt::format("'{} object' has no attribute '{}'", object.type_name(), name)};
}

Value get_item(const Value& object, const Value& key, int line) {
  if (object.is_undefined()) fail_undefined(object.as_undefined(), line);
  if (object.is_dict()) {
    if (const Value* v = object.as_dict().find(key)) return *v;
    return Undefined{fmt::format("'{} object' has no attribute {}", object.type_name(), to_repr(key))};
  }
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.to_int();
    if (object.is_list()) {
      const auto& items = object.as_list().items;
      if (i < 0) i += int64_t(items.size());
      if (i >= 0 && i < int64_t(items.size())) return items[size_t(i)];
    } else {
      const std::vector<uint32_t> cps = py::decode(object.as_string());
      if (i < 0) i += int64_t(cps.size());
      if (i >= 0 && i < int64_t(cps.size())) return py::encode({cps[size_t(i)]});
    }
    return Undefined{fmt::format("'{} object' has no element {}", object.type_name(), key.to_int())};
  }
  return Undefined{fmt::format("'{} object' has no element {}", object.type_name(), to_repr(key))};
}

Value get_slice(const Value& object, std::optional<int64_t> start, std::optional<int64_t> stop,
                std::optional<int64_t> step, int line) {
  if (object.is_undefined()) fail_undefined(object.as_undefined(), line);
  KILN_CHECK(step.value_or(1) != 0, invalid_argument, "chat template line {}: slice step cannot be zero", line);
  if (object.is_string()) {
    const std::vector<uint32_t> cps = py::decode(object.as_string());
    std::vector<uint32_t> out;
    for (int64_t i : py::slice_indices(int64_t(cps.size()), start, stop, step)) out.push_back(cps[size_t(i)]);
    return py::encode(out);
  }
  if (object.is_list()) {
    const auto& items = object.as_list().items;
    std::vector<Value> out;
    for (int64_t i : py::slice_indices(int64_t(items.size()), start, stop, step)) out.push_back(items[size_t(i)]);
    return Value::list(std::move(out), object.as_list().is_tuple);
  }
  fail_type(line, fmt::format("'{}' object is not subscriptable", object.type_name()));
}

std::vector<Value> iterate(const Value& v, int line) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.as_list().items;
  if (v.is_mapping()) {
    std::vector<Value> keys;
    for (const auto& [k, _] : v.as_dict().entries) keys.push_back(k);
    return keys;
  }
  if (v.is_string()) {
    std::vector<Value> chars;
    for (uint32_t cp : py::decode(v.as_string())) chars.emplace_back(py::encode({cp}));
    return chars;
  }
  fail_type(line, fmt::format("'{}' object is not iterable", v.type_name()));
}

}  // namespace kiln::jinja
