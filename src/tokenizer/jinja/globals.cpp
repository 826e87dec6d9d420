#include "tokenizer/jinja/globals.h"

#include <ctime>

#include "core/check.h"
#include "tokenizer/jinja/call_args.h"

namespace kiln::jinja {
namespace {

// transformers' TemplateNamespace refuses underscore-prefixed names, which could otherwise reach
// Python internals; kiln keeps the rule so templates behave the same.
void check_namespace_name(const std::string& name) {
  KILN_CHECK(name.empty() || name[0] != '_', invalid_argument,
             "chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'", name);
}

// dict(mapping?, **kwargs) and namespace(mapping?, **kwargs) build their items the same way.
Value dict_from_args(const CallArgs& a, const char* what, bool is_namespace) {
  KILN_CHECK(a.positional.size() <= 1, invalid_argument, "{}() takes at most one positional argument", what);
  Value d = Value::dict();
  d.as_dict().is_namespace = is_namespace;
  if (!a.positional.empty()) {
    const Value& init = a.positional[0];
    if (init.is_mapping()) {
      for (const auto& [k, v] : init.as_dict().entries) d.as_dict().set(k, v);
    } else if (init.is_list()) {
      for (const Value& pair : init.as_list().items) {
        KILN_CHECK(pair.is_list() && pair.as_list().items.size() == 2, invalid_argument,
                   "{}(): each item of the sequence must be a (key, value) pair", what);
        d.as_dict().set(pair.as_list().items[0], pair.as_list().items[1]);
      }
    } else {
      KILN_FAIL(invalid_argument, "{}(): cannot build from a {}", what, init.type_name());
    }
  }
  for (const auto& [k, v] : a.keyword) d.as_dict().set(Value(k), v);
  if (is_namespace)
    for (const auto& [k, _] : d.as_dict().entries)
      if (k.is_string()) check_namespace_name(k.as_string());
  return d;
}

Value range(const CallArgs& a) {
  KILN_CHECK(a.keyword.empty() && !a.positional.empty() && a.positional.size() <= 3, invalid_argument,
             "range() takes 1 to 3 integer arguments");
  std::vector<int64_t> n;
  for (const Value& v : a.positional) {
    KILN_CHECK(v.is_int() || v.is_bool(), invalid_argument, "range() arguments must be integers, not {}",
               v.type_name());
    n.push_back(v.to_int());
  }
  const int64_t start = n.size() == 1 ? 0 : n[0];
  const int64_t stop = n.size() == 1 ? n[0] : n[1];
  const int64_t step = n.size() == 3 ? n[2] : 1;
  KILN_CHECK(step != 0, invalid_argument, "range() step must not be zero");
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    KILN_CHECK(int64_t(items.size()) < kMaxRange, invalid_argument,
               "range() too big: the sandbox allows at most {} items", kMaxRange);
    items.emplace_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;  // past 64 bits is past stop
  }
  return Value::list(std::move(items));
}

Value strftime_now(const CallArgs& a) {
  BoundArgs args(a, "strftime_now()", 0, {"format"});
  args.require(0, "format");
  const std::string format = args.string(0);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string buf(256 + format.size() * 8, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
  buf.resize(n);
  return buf;
}

}  // namespace

void add_globals(std::map<std::string, Value>& scope) {
  scope.emplace("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
                  const std::string message = a.positional.empty() ? std::string() : to_str(a.positional[0]);
                  KILN_FAIL(invalid_argument, "the chat template refused this conversation: {}", message);
                }));
  scope.emplace("strftime_now", Value::function("strftime_now", strftime_now));
  scope.emplace("namespace", Value::function("namespace", [](const CallArgs& a) {
                  return dict_from_args(a, "namespace", true);
                }));
  scope.emplace("dict", Value::function("dict", [](const CallArgs& a) { return dict_from_args(a, "dict", false); }));
  scope.emplace("range", Value::function("range", range));
}

}  // namespace kiln::jinja
