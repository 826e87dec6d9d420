// Jinja's built-in filters (jinja2/filters.py), with transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

#include "core/check.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/call_args.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/py_string.h"

namespace kiln::jinja {
namespace {

using FilterFn = std::function<Value(const Value&, const CallArgs&, int)>;

std::string what(std::string_view name) { return "filter '" + std::string(name) + "'"; }

// Jinja's soft_str: what {{ }} would print (Undefined is "").
std::string text_of(const Value& v) { return to_str(v); }

// The attribute= argument of map/sort/join/...: "a.b" looks up a, then b; integers index.
Value lookup_path(const Value& item, const Value& path, int line) {
  if (path.is_int()) return get_item(item, path, line);
  Value v = item;
  for (const std::string& part : py::split(text_of(path), std::string("."), -1)) {
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = numeric ? get_item(v, int64_t(std::strtoll(part.c_str(), nullptr, 10)), line) : get_attribute(v, part, line);
  }
  return v;
}

Value filter_default(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("default"), line, {"default_value", "boolean"});
  const bool use_default = v.is_undefined() || (args.get_or(1, false).truthy() && !v.truthy());
  return use_default ? args.get_or(0, std::string()) : v;
}

Value filter_length(const Value& v, const CallArgs& a, int line) {
  BoundArgs(a, what("length"), line, {});
  if (v.is_string()) return int64_t(py::length(v.as_string()));
  if (v.is_list()) return int64_t(v.as_list().items.size());
  if (v.is_mapping()) return int64_t(v.as_dict().entries.size());
  if (v.is_undefined()) return int64_t(0);
  fail_type(line, fmt::format("object of type '{}' has no len()", v.type_name()));
}

Value filter_first(const Value& v, const CallArgs& a, int line) {
  BoundArgs(a, what("first"), line, {});
  std::vector<Value> items = iterate(v, line);
  return items.empty() ? Value(Undefined{"first() of an empty sequence"}) : items.front();
}

Value filter_last(const Value& v, const CallArgs& a, int line) {
  BoundArgs(a, what("last"), line, {});
  std::vector<Value> items = iterate(v, line);
  return items.empty() ? Value(Undefined{"last() of an empty sequence"}) : items.back();
}

Value filter_join(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("join"), line, {"d", "attribute"});
  const std::string sep = args.has(0) ? text_of(args.get(0)) : std::string();
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v, line)) {
    if (!first) out += sep;
    first = false;
    out += text_of(args.has(1) ? lookup_path(item, args.get(1), line) : item);
    check_value_size(out.size(), line);
  }
  return out;
}

Value filter_trim(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("trim"), line, {"chars"});
  std::optional<std::string> chars;
  if (args.has(0) && !args.get(0).is_none()) chars = args.string(0);
  return py::strip(text_of(v), chars, true, true);
}

Value filter_replace(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("replace"), line, {"old", "new", "count"});
  args.require(0, "old");
  args.require(1, "new");
  const int64_t count = args.has(2) && !args.get(2).is_none() ? args.integer(2) : -1;
  return bounded_replace(text_of(v), text_of(args.get(0)), text_of(args.get(1)), count, line);
}

Value filter_int(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("int"), line, {"default", "base"});
  const Value fallback = args.get_or(0, int64_t(0));
  const int base = int(args.has(1) ? args.integer(1) : 10);
  if (v.is_undefined()) fail_undefined(v.as_undefined(), line);  // Python's int() on Undefined fails
  if (v.is_int() || v.is_bool()) return v.to_int();
  if (v.is_float()) return std::isfinite(v.as_float()) ? Value(int_from_double(v.as_float(), line)) : fallback;
  if (v.is_string()) {
    const std::string s = py::strip(v.as_string(), std::nullopt, true, true);
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, base);
    if (!s.empty() && *end == 0 && errno == 0) return int64_t(i);
    const double d = std::strtod(s.c_str(), &end);  // Jinja falls back to int(float(s))
    if (base == 10 && !s.empty() && *end == 0 && std::isfinite(d)) return int_from_double(d, line);
  }
  return fallback;
}

Value filter_float(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("float"), line, {"default"});
  const Value fallback = args.get_or(0, 0.0);
  if (v.is_undefined()) fail_undefined(v.as_undefined(), line);
  if (v.is_number()) return v.to_double();
  if (v.is_string()) {
    const std::string s = py::strip(v.as_string(), std::nullopt, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == 0) return d;
  }
  return fallback;
}

Value filter_items(const Value& v, const CallArgs& a, int line) {
  BoundArgs(a, what("items"), line, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_mapping()) fail_type(line, fmt::format("filter 'items' can only be used on a mapping, not {}", v.type_name()));
  std::vector<Value> pairs;
  for (const auto& [k, val] : v.as_dict().entries) pairs.push_back(Value::list({k, val}, true));
  return Value::list(std::move(pairs));
}

// indent= of tojson and width of indent: a string, or that many spaces (checked before it is made).
std::string padding(const Value& width, const char* filter, int line) {
  if (width.is_string()) return width.as_string();
  KILN_CHECK(width.is_int() || width.is_bool(), invalid_argument,
             "chat template line {}: filter '{}' expects an integer or string width, got {}", line, filter,
             width.type_name());
  const int64_t spaces = std::max<int64_t>(0, width.to_int());
  check_value_size(size_t(std::min<int64_t>(spaces, int64_t(kMaxValueBytes) + 1)), line);
  return std::string(size_t(spaces), ' ');
}

Value filter_tojson(const Value& v, const CallArgs& a, int line) {
  // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  BoundArgs args(a, what("tojson"), line, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = args.get_or(0, false).truthy();
  if (args.has(1) && !args.get(1).is_none()) {
    o.indent = padding(args.get(1), "tojson", line);
  }
  if (args.has(2) && !args.get(2).is_none()) {
    const Value& seps = args.get(2);
    KILN_CHECK(seps.is_list() && seps.as_list().items.size() == 2 && seps.as_list().items[0].is_string() &&
                   seps.as_list().items[1].is_string(),
               invalid_argument, "chat template line {}: tojson separators must be two strings", line);
    o.item_separator = seps.as_list().items[0].as_string();
    o.key_separator = seps.as_list().items[1].as_string();
  }
  o.sort_keys = args.get_or(3, false).truthy();
  return to_json(v, o, line);
}

Value filter_list(const Value& v, const CallArgs& a, int line) {
  BoundArgs(a, what("list"), line, {});
  return Value::list(iterate(v, line));
}

Value filter_reverse(const Value& v, const CallArgs& a, int line) {
  BoundArgs(a, what("reverse"), line, {});
  if (v.is_string()) {
    std::vector<uint32_t> cps = py::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return py::encode(cps);
  }
  std::vector<Value> items = iterate(v, line);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

// Python's sort key for sort/unique with case_sensitive=False: strings compare lower-cased.
Value sort_key(const Value& v, bool case_sensitive) {
  return v.is_string() && !case_sensitive ? Value(py::lower(v.as_string())) : v;
}

Value filter_sort(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("sort"), line, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = args.get_or(0, false).truthy();
  const bool case_sensitive = args.get_or(1, false).truthy();
  std::vector<Value> items = iterate(v, line);
  std::vector<Value> keys;
  for (const Value& item : items)
    keys.push_back(sort_key(args.has(2) ? lookup_path(item, args.get(2), line) : item, case_sensitive));
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return reverse ? compare_op("<", keys[y], keys[x], line) : compare_op("<", keys[x], keys[y], line);
  });
  std::vector<Value> sorted;
  for (size_t i : order) sorted.push_back(items[i]);
  return Value::list(std::move(sorted));
}

Value filter_unique(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("unique"), line, {"case_sensitive", "attribute"});
  const bool case_sensitive = args.get_or(0, false).truthy();
  std::vector<Value> seen, out;
  for (const Value& item : iterate(v, line)) {
    Value key = sort_key(args.has(1) ? lookup_path(item, args.get(1), line) : item, case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

// select/reject(seq, test, *args) and selectattr/rejectattr(seq, attr, test, *args).
Value select_items(const Value& v, const CallArgs& a, int line, bool by_attribute, bool keep_matches) {
  std::vector<Value> rest = a.positional;
  Value attribute;
  if (by_attribute) {
    KILN_CHECK(!rest.empty(), invalid_argument, "chat template line {}: selectattr/rejectattr need an attribute name",
               line);
    attribute = rest.front();
    rest.erase(rest.begin());
  }
  std::string test;
  if (!rest.empty()) {
    KILN_CHECK(rest.front().is_string(), invalid_argument, "chat template line {}: the test name must be a string",
               line);
    test = rest.front().as_string();
    rest.erase(rest.begin());
    KILN_CHECK(is_known_test(test), unsupported, "chat template line {}: the test '{}' is not supported", line, test);
  }
  CallArgs test_args{rest, {}};
  std::vector<Value> out;
  for (const Value& item : iterate(v, line)) {
    const Value subject = by_attribute ? lookup_path(item, attribute, line) : item;
    const bool match = test.empty() ? subject.truthy() : apply_test(test, subject, test_args, line);
    if (match == keep_matches) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_map(const Value& v, const CallArgs& a, int line) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [key, value] : a.keyword) {
    if (key == "attribute") attribute = &value;
    else if (key == "default") fallback = &value;
    else KILN_FAIL(invalid_argument, "chat template line {}: filter 'map' got an unexpected keyword '{}'", line, key);
  }
  if (attribute) {
    for (const Value& item : iterate(v, line)) {
      Value x = lookup_path(item, *attribute, line);
      out.push_back(x.is_undefined() && fallback ? *fallback : x);
    }
    return Value::list(std::move(out));
  }
  KILN_CHECK(!a.positional.empty() && a.positional[0].is_string(), invalid_argument,
             "chat template line {}: map needs a filter name or attribute=", line);
  const std::string filter = a.positional[0].as_string();
  KILN_CHECK(is_known_filter(filter), unsupported, "chat template line {}: the filter '{}' is not supported", line,
             filter);
  CallArgs filter_args{std::vector<Value>(a.positional.begin() + 1, a.positional.end()), {}};
  for (const Value& item : iterate(v, line)) out.push_back(apply_filter(filter, item, filter_args, line));
  return Value::list(std::move(out));
}

Value filter_indent(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("indent"), line, {"width", "first", "blank"});
  // Jinja's default width is 4 (args.integer(0) read the unset argument: a bare |indent failed).
  const std::string pad = padding(args.get_or(0, int64_t(4)), "indent", line);
  const bool first = args.get_or(1, false).truthy(), blank = args.get_or(2, false).truthy();
  if (v.is_undefined()) fail_undefined(v.as_undefined(), line);
  std::string s = text_of(v);
  // Jinja splits with str.splitlines() and joins with "\n", so a trailing newline survives.
  const bool trailing_newline = !s.empty() && s.back() == '\n';
  std::vector<std::string> lines = py::splitlines(s);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    const bool indent_line = (i > 0 || first) && (blank || !py::strip(lines[i], std::nullopt, true, true).empty());
    out += (indent_line ? pad : std::string()) + lines[i];
    check_value_size(out.size(), line);
  }
  if (trailing_newline) out += '\n';
  return out;
}

Value filter_escape(const Value& v, const CallArgs& a, int line) {
  BoundArgs(a, what("escape"), line, {});
  std::string out;
  for (char c : text_of(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value filter_round(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("round"), line, {"precision", "method"});
  const int64_t precision = args.has(0) ? args.integer(0) : 0;
  const std::string method = args.has(1) ? args.string(1) : "common";
  KILN_CHECK(v.is_number(), invalid_argument, "chat template line {}: round expects a number, got {}", line, v.type_name());
  const double scale = std::pow(10.0, double(precision));
  const double x = v.to_double() * scale;
  double r;
  if (method == "common") r = std::round(x);
  else if (method == "ceil") r = std::ceil(x);
  else if (method == "floor") r = std::floor(x);
  else KILN_FAIL(invalid_argument, "chat template line {}: round method must be common, ceil or floor", line);
  return r / scale;
}

Value filter_sum(const Value& v, const CallArgs& a, int line) {
  BoundArgs args(a, what("sum"), line, {"attribute", "start"});
  Value total = args.get_or(1, int64_t(0));
  for (const Value& item : iterate(v, line))
    total = binary_op("+", total, args.has(0) ? lookup_path(item, args.get(0), line) : item, line);
  return total;
}

Value string_filter(const Value& v, const CallArgs& a, int line, const char* name, std::string (*f)(std::string_view)) {
  BoundArgs(a, what(name), line, {});
  return f(text_of(v));
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = {
      {"abs", [](const Value& v, const CallArgs& a, int line) -> Value {
         BoundArgs(a, what("abs"), line, {});
         if (v.is_float()) return std::fabs(v.as_float());
         if (v.is_int() || v.is_bool()) return v.to_int() < 0 ? int_negate(v.to_int(), line) : v.to_int();
         fail_type(line, fmt::format("bad operand type for abs(): '{}'", v.type_name()));
       }},
      {"attr", [](const Value& v, const CallArgs& a, int line) {
         BoundArgs args(a, what("attr"), line, {"name"});
         args.require(0, "name");
         return get_attribute(v, args.string(0), line);
       }},
      {"capitalize", [](const Value& v, const CallArgs& a, int l) { return string_filter(v, a, l, "capitalize", py::capitalize); }},
      {"count", filter_length},
      {"d", filter_default},
      {"default", filter_default},
      {"e", filter_escape},
      {"escape", filter_escape},
      {"first", filter_first},
      {"float", filter_float},
      {"indent", filter_indent},
      {"int", filter_int},
      {"items", filter_items},
      {"join", filter_join},
      {"last", filter_last},
      {"length", filter_length},
      {"list", filter_list},
      {"lower", [](const Value& v, const CallArgs& a, int l) { return string_filter(v, a, l, "lower", py::lower); }},
      {"map", filter_map},
      {"reject", [](const Value& v, const CallArgs& a, int l) { return select_items(v, a, l, false, false); }},
      {"rejectattr", [](const Value& v, const CallArgs& a, int l) { return select_items(v, a, l, true, false); }},
      {"replace", filter_replace},
      {"reverse", filter_reverse},
      {"round", filter_round},
      {"safe", [](const Value& v, const CallArgs& a, int line) {
         BoundArgs(a, what("safe"), line, {});
         return v;
       }},
      {"select", [](const Value& v, const CallArgs& a, int l) { return select_items(v, a, l, false, true); }},
      {"selectattr", [](const Value& v, const CallArgs& a, int l) { return select_items(v, a, l, true, true); }},
      {"sort", filter_sort},
      {"string", [](const Value& v, const CallArgs& a, int line) -> Value {
         BoundArgs(a, what("string"), line, {});
         return text_of(v);
       }},
      {"sum", filter_sum},
      {"title", [](const Value& v, const CallArgs& a, int l) { return string_filter(v, a, l, "title", py::title); }},
      {"tojson", filter_tojson},
      {"trim", filter_trim},
      {"unique", filter_unique},
      {"upper", [](const Value& v, const CallArgs& a, int l) { return string_filter(v, a, l, "upper", py::upper); }},
  };
  return table;
}

}  // namespace

bool is_known_filter(std::string_view name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args, int line) {
  auto it = filters().find(name);
  KILN_CHECK(it != filters().end(), unsupported, "chat template line {}: the filter '{}' is not supported", line, name);
  return it->second(subject, args, line);
}

}  // namespace kiln::jinja
