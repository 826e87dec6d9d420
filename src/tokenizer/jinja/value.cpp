#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/jinja/py_string.h"

namespace kiln::jinja {

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (equals(k, key)) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->is_tuple = is_tuple;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<Dict>()); }

Value Value::function(std::string name, std::function<Value(const CallArgs&)> call) {
  return Value(std::make_shared<const Callable>(Callable{std::move(name), std::move(call)}));
}

double Value::to_double() const {
  if (is_float()) return as_float();
  if (is_int()) return double(as_int());
  return as_bool() ? 1.0 : 0.0;
}

int64_t Value::to_int() const {
  if (is_int()) return as_int();
  return as_bool() ? 1 : 0;
}

bool Value::truthy() const {
  struct Visitor {
    bool operator()(const Undefined&) const { return false; }
    bool operator()(const None&) const { return false; }
    bool operator()(bool b) const { return b; }
    bool operator()(int64_t i) const { return i != 0; }
    bool operator()(double d) const { return d != 0.0; }
    bool operator()(const std::string& s) const { return !s.empty(); }
    bool operator()(const ListPtr& l) const { return !l->items.empty(); }
    bool operator()(const DictPtr& d) const { return d->is_namespace || !d->entries.empty(); }
    bool operator()(const CallablePtr&) const { return true; }
  };
  return std::visit(Visitor{}, v_);
}

const char* Value::type_name() const {
  struct Visitor {
    const char* operator()(const Undefined&) const { return "Undefined"; }
    const char* operator()(const None&) const { return "NoneType"; }
    const char* operator()(bool) const { return "bool"; }
    const char* operator()(int64_t) const { return "int"; }
    const char* operator()(double) const { return "float"; }
    const char* operator()(const std::string&) const { return "str"; }
    const char* operator()(const ListPtr& l) const { return l->is_tuple ? "tuple" : "list"; }
    const char* operator()(const DictPtr& d) const { return d->is_namespace ? "Namespace" : "dict"; }
    const char* operator()(const CallablePtr&) const { return "function"; }
  };
  return std::visit(Visitor{}, v_);
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    return a.to_int() == b.to_int();
  }
  if (a.storage().index() != b.storage().index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.as_string() == b.as_string();
  if (a.is_list()) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    if (x.size() != y.size() || a.as_list().is_tuple != b.as_list().is_tuple) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict()) {
    const Dict& x = a.as_dict();
    const Dict& y = b.as_dict();
    if (x.is_namespace || y.is_namespace) return &x == &y;  // objects compare by identity
    if (x.entries.size() != y.entries.size()) return false;
    for (const auto& [k, v] : x.entries) {
      const Value* other = y.find(k);
      if (!other || !equals(v, *other)) return false;
    }
    return true;
  }
  if (a.is_callable()) return &a.as_callable() == &b.as_callable();
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form ("1.2345e+02"), rearranged by CPython's rule:
  // positional when -4 <= exponent < 16, scientific otherwise; positional always shows a ".0".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::atoi(sci.c_str() + e_pos + 1);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exponent < -4 || exponent >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exponent < 0 ? "e-" : "e+";
    const int mag = std::abs(exponent);
    if (mag < 10) out += '0';
    return out + std::to_string(mag);
  }
  std::string out;
  if (exponent < 0) {
    out = "0." + std::string(size_t(-exponent - 1), '0') + digits;
  } else if (size_t(exponent) + 1 >= digits.size()) {
    out = digits + std::string(size_t(exponent) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, size_t(exponent) + 1) + "." + digits.substr(size_t(exponent) + 1);
  }
  return sign + out;
}

// Printing recurses into lists and dicts, and a namespace can hold itself ({% set ns.me = ns %}):
// the depth is bounded (kMaxPrintDepth, as tojson's), and so is the text (a list can hold one big
// string many times by reference).
static std::string str_at(const Value& v, int depth);
static std::string repr_at(const Value& v, int depth) {
  if (v.is_string()) return py::repr(v.as_string());
  if (v.is_undefined()) return "Undefined";
  return str_at(v, depth);
}

static void check_printed(const std::string& out) {
  KILN_CHECK(out.size() <= kMaxValueBytes, invalid_argument, "chat template: a printed value grew past {} MiB",
             kMaxValueBytes >> 20);
}

static std::string sequence_str(const List& l, int depth) {
  std::string out = l.is_tuple ? "(" : "[";
  for (size_t i = 0; i < l.items.size(); ++i) {
    if (i) out += ", ";
    out += repr_at(l.items[i], depth + 1);
    check_printed(out);
  }
  if (l.is_tuple && l.items.size() == 1) out += ",";
  return out + (l.is_tuple ? ")" : "]");
}

static std::string dict_str(const Dict& d, int depth) {
  std::string out = d.is_namespace ? "<Namespace {" : "{";
  for (size_t i = 0; i < d.entries.size(); ++i) {
    if (i) out += ", ";
    out += repr_at(d.entries[i].first, depth + 1) + ": " + repr_at(d.entries[i].second, depth + 1);
    check_printed(out);
  }
  return out + (d.is_namespace ? "}>" : "}");
}

static std::string str_at(const Value& v, int depth) {
  struct Visitor {
    int depth;
    std::string operator()(const Undefined&) const { return ""; }
    std::string operator()(const None&) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return float_repr(d); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const ListPtr& l) const { return sequence_str(*l, depth); }
    std::string operator()(const DictPtr& d) const { return dict_str(*d, depth); }
    std::string operator()(const CallablePtr& c) const { return "<function " + c->name + ">"; }
  };
  KILN_CHECK(depth < kMaxPrintDepth, invalid_argument, "chat template: a value nested too deeply to print");
  return std::visit(Visitor{depth}, v.storage());
}

std::string to_str(const Value& v) { return str_at(v, 0); }

std::string to_repr(const Value& v) { return repr_at(v, 0); }

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return None{};
    case nlohmann::ordered_json::value_t::boolean: return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: return int64_t(j.get<uint64_t>());
    case nlohmann::ordered_json::value_t::number_float: return j.get<double>();
    case nlohmann::ordered_json::value_t::string: return j.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      for (const auto& [k, e] : j.items()) d.as_dict().entries.emplace_back(Value(k), from_json(e));
      return d;
    }
    default: return None{};  // binary and discarded values do not occur in parsed JSON
  }
}

}  // namespace kiln::jinja
