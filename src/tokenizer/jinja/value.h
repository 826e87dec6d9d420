// The values a Jinja template computes with, modelled on the Python objects Jinja sees when
// transformers renders a chat template: None, bool, int, float, str, list/tuple, dict, callables,
// and Jinja's Undefined. Lists and dicts are shared by reference like Python's (a namespace()
// changed inside a loop is seen after it); the sandbox transformers uses forbids mutating them
// otherwise, so sharing never surprises.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kiln::jinja {

// Bound on any string or list a template builds, so that "x" * 10**12 fails instead of exhausting
// memory (Python would raise MemoryError).
constexpr size_t kMaxValueBytes = size_t(64) << 20;
// Bound on the nesting printing and tojson follow: a namespace can hold itself.
constexpr int kMaxPrintDepth = 200;

class Value;

// Jinja's default Undefined: a missing variable, key or attribute. Printing it gives "", it is
// falsy and iterates as empty; doing anything else with it is an error that says `reason`
// (Jinja's wording: "'x' is undefined", "'dict object' has no attribute 'y'").
struct Undefined {
  std::string reason;
};
struct None {};

struct List {
  std::vector<Value> items;
  bool is_tuple = false;  // only changes how it prints: (a, b) instead of [a, b]
};

// An insertion-ordered dict (Python 3.7+ semantics, which tojson and items() expose). Linear
// lookup: template dicts hold a handful of keys.
struct Dict {
  std::vector<std::pair<Value, Value>> entries;
  bool is_namespace = false;  // a namespace() object: attributes, assignable with {% set ns.x %}

  const Value* find(const Value& key) const;
  void set(Value key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

using ListPtr = std::shared_ptr<List>;
using DictPtr = std::shared_ptr<Dict>;
using CallablePtr = std::shared_ptr<const Callable>;

class Value {
 public:
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, CallablePtr>;

  Value() : v_(Undefined{}) {}
  Value(Undefined u) : v_(std::move(u)) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(ListPtr l) : v_(std::move(l)) {}
  Value(DictPtr d) : v_(std::move(d)) {}
  Value(CallablePtr c) : v_(std::move(c)) {}

  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict();
  static Value function(std::string name, std::function<Value(const CallArgs&)> call);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }  // bool is not an int here
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is a Number
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<ListPtr>(v_); }
  bool is_dict() const { return std::holds_alternative<DictPtr>(v_); }  // namespaces included
  bool is_mapping() const { return is_dict() && !as_dict().is_namespace; }
  bool is_callable() const { return std::holds_alternative<CallablePtr>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  List& as_list() const { return *std::get<ListPtr>(v_); }
  Dict& as_dict() const { return *std::get<DictPtr>(v_); }
  const Callable& as_callable() const { return *std::get<CallablePtr>(v_); }
  const Undefined& as_undefined() const { return std::get<Undefined>(v_); }

  // Number as double (bool, int, float); int64 for bool and int.
  double to_double() const;
  int64_t to_int() const;

  // Python's truth value (Undefined is falsy).
  bool truthy() const;
  // Python's type name, for error messages: "str", "int", "list", "dict", "NoneType", ...
  const char* type_name() const;

  const Storage& storage() const { return v_; }

 private:
  Storage v_;
};

// Python ==: 1 == 1.0 == True; lists and dicts compare element-wise; two Undefined are equal.
bool equals(const Value& a, const Value& b);

// Python str() and repr() of a value, as Jinja prints it: {{ 1.0 }} is "1.0", {{ none }} is
// "None", {{ [1, 'a'] }} is "[1, 'a']"; Undefined prints as "".
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// Python's repr() of a float: the shortest text that reads back exactly ("0.1", "1e+16", "2.0").
std::string float_repr(double d);

// A JSON document as template data (objects keep their key order, as Python's json.loads does).
Value from_json(const nlohmann::ordered_json& j);

}  // namespace kiln::jinja
