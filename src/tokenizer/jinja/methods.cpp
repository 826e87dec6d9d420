// The Python methods chat templates call on values: str (strip, split, startswith, ...), dict
// (items, keys, values, get) and list (index, count). Mutating methods (append, pop, update) are
// refused by transformers' immutable sandbox, and so by kiln.
#include <algorithm>

#include "core/check.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/call_args.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/py_string.h"

namespace kiln::jinja {
namespace {

std::string what(const std::string& type, const std::string& method) { return type + "." + method + "()"; }

Value string_list(const std::vector<std::string>& parts) {
  std::vector<Value> items(parts.begin(), parts.end());
  return Value::list(std::move(items));
}

std::optional<std::string> optional_string(const BoundArgs& args, size_t i) {
  if (!args.has(i) || args.get(i).is_none()) return std::nullopt;
  return args.string(i);
}

// startswith/endswith take a string or a tuple of strings, and optional start/end positions.
bool affix_matches(const std::string& s, const BoundArgs& args, bool at_start, int line) {
  args.require(0, at_start ? "prefix" : "suffix");
  std::string_view view = s;
  if (args.has(1) || args.has(2)) {
    const std::vector<uint32_t> cps = py::decode(s);
    const auto n = int64_t(cps.size());
    auto clamp = [&](int64_t x) { return std::clamp<int64_t>(x < 0 ? x + n : x, 0, n); };
    const int64_t b = args.has(1) && !args.get(1).is_none() ? clamp(args.integer(1)) : 0;
    const int64_t e = args.has(2) && !args.get(2).is_none() ? clamp(args.integer(2)) : n;
    const std::string sub = b < e ? py::encode(std::vector<uint32_t>(cps.begin() + b, cps.begin() + e)) : std::string();
    return affix_matches(sub, BoundArgs(CallArgs{{args.get(0)}, {}}, "startswith", line, {"affix"}), at_start, line);
  }
  std::vector<Value> candidates = args.get(0).is_list() ? args.get(0).as_list().items : std::vector<Value>{args.get(0)};
  for (const Value& c : candidates) {
    KILN_CHECK(c.is_string(), invalid_argument, "chat template line {}: {} arg must be str or a tuple of str, not {}",
               line, at_start ? "startswith" : "endswith", c.type_name());
    const std::string& a = c.as_string();
    if (view.size() >= a.size() && (at_start ? view.substr(0, a.size()) : view.substr(view.size() - a.size())) == a)
      return true;
  }
  return false;
}

Value string_method(const std::string& s, const std::string& m, const CallArgs& a, int line) {
  const std::string name = what("str", m);
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    BoundArgs args(a, name, line, {"chars"});
    return py::strip(s, optional_string(args, 0), m != "rstrip", m != "lstrip");
  }
  if (m == "split" || m == "rsplit") {
    BoundArgs args(a, name, line, {"sep", "maxsplit"});
    const std::optional<std::string> sep = optional_string(args, 0);
    KILN_CHECK(!sep || !sep->empty(), invalid_argument, "chat template line {}: {}: empty separator", line, name);
    const int64_t maxsplit = args.has(1) ? args.integer(1) : -1;
    return string_list(m == "split" ? py::split(s, sep, maxsplit) : py::rsplit(s, sep, maxsplit));
  }
  if (m == "splitlines") {
    BoundArgs(a, name, line, {});
    return string_list(py::splitlines(s));
  }
  if (m == "startswith" || m == "endswith") {
    BoundArgs args(a, name, line, {"affix", "start", "end"});
    return affix_matches(s, args, m == "startswith", line);
  }
  if (m == "upper" || m == "lower" || m == "title" || m == "capitalize") {
    BoundArgs(a, name, line, {});
    if (m == "upper") return py::upper(s);
    if (m == "lower") return py::lower(s);
    if (m == "title") return py::title(s);
    return py::capitalize(s);
  }
  if (m == "replace") {
    BoundArgs args(a, name, line, {"old", "new", "count"});
    args.require(0, "old");
    args.require(1, "new");
    return bounded_replace(s, args.string(0), args.string(1), args.has(2) ? args.integer(2) : -1, line);
  }
  if (m == "find" || m == "rfind" || m == "count") {
    BoundArgs args(a, name, line, {"sub"});
    args.require(0, "sub");
    const std::string sub = args.string(0);
    if (m == "count") {
      if (sub.empty()) return int64_t(py::length(s) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return n;
    }
    const size_t p = m == "find" ? s.find(sub) : s.rfind(sub);
    return p == std::string::npos ? int64_t(-1) : int64_t(py::length(std::string_view(s).substr(0, p)));
  }
  if (m == "join") {
    BoundArgs args(a, name, line, {"iterable"});
    args.require(0, "iterable");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(args.get(0), line)) {
      KILN_CHECK(item.is_string(), invalid_argument, "chat template line {}: str.join() expected str items, found {}",
                 line, item.type_name());
      if (!first) out += s;
      first = false;
      out += item.as_string();
      check_value_size(out.size(), line);
    }
    return out;
  }
  if (m == "removeprefix" || m == "removesuffix") {
    BoundArgs args(a, name, line, {"affix"});
    args.require(0, "affix");
    const std::string affix = args.string(0);
    if (m == "removeprefix") return s.rfind(affix, 0) == 0 ? s.substr(affix.size()) : s;
    return s.size() >= affix.size() && s.compare(s.size() - affix.size(), affix.size(), affix) == 0
               ? s.substr(0, s.size() - affix.size())
               : s;
  }
  if (m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isspace" || m == "isupper" || m == "islower") {
    BoundArgs(a, name, line, {});
    const std::vector<uint32_t> cps = py::decode(s);
    if (m == "isupper") return py::upper(s) == s && py::lower(s) != s;
    if (m == "islower") return py::lower(s) == s && py::upper(s) != s;
    if (cps.empty()) return false;
    return std::all_of(cps.begin(), cps.end(), [&](uint32_t c) {
      const bool digit = c >= '0' && c <= '9';
      const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      if (m == "isdigit") return digit;
      if (m == "isalpha") return alpha;
      if (m == "isalnum") return alpha || digit;
      return py::is_space(c);
    });
  }
  KILN_FAIL(unsupported, "chat template line {}: the string method {} is not supported", line, name);
}

Value dict_method(const Dict& d, const std::string& m, const CallArgs& a, int line) {
  const std::string name = what("dict", m);
  if (m == "items" || m == "keys" || m == "values") {
    BoundArgs(a, name, line, {});
    std::vector<Value> out;
    for (const auto& [k, v] : d.entries) {
      if (m == "items") out.push_back(Value::list({k, v}, true));
      else out.push_back(m == "keys" ? k : v);
    }
    return Value::list(std::move(out));
  }
  if (m == "get") {
    BoundArgs args(a, name, line, {"key", "default"});
    args.require(0, "key");
    const Value* v = d.find(args.get(0));
    return v ? *v : args.get_or(1, None{});
  }
  KILN_FAIL(unsupported, "chat template line {}: the dict method {} is not supported", line, name);
}

Value list_method(const List& l, const std::string& m, const CallArgs& a, int line) {
  const std::string name = what(l.is_tuple ? "tuple" : "list", m);
  if (m == "index" || m == "count") {
    BoundArgs args(a, name, line, {"value"});
    args.require(0, "value");
    int64_t count = 0;
    for (size_t i = 0; i < l.items.size(); ++i) {
      if (!equals(l.items[i], args.get(0))) continue;
      if (m == "index") return int64_t(i);
      ++count;
    }
    KILN_CHECK(m == "count", invalid_argument, "chat template line {}: {}: value is not in the list", line, name);
    return count;
  }
  KILN_FAIL(unsupported, "chat template line {}: the list method {} is not supported", line, name);
}

}  // namespace

Value call_method(const Value& object, const std::string& method, const CallArgs& args, int line) {
  if (object.is_undefined()) fail_undefined(object.as_undefined(), line);
  if (object.is_string()) return string_method(object.as_string(), method, args, line);
  if (object.is_mapping()) return dict_method(object.as_dict(), method, args, line);
  if (object.is_list()) return list_method(object.as_list(), method, args, line);
  fail_type(line, fmt::format("'{} object' has no attribute '{}'", object.type_name(), method));
}

}  // namespace kiln::jinja
