// Jinja's built-in tests ("x is defined", "x is not none", ...; jinja2/tests.py). Python's type
// model decides the answers: bool is a number, a string is iterable and a sequence, and so is
// Undefined (it has __len__ and __getitem__, even though using the latter fails).
#include <functional>
#include <map>

#include "core/check.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/call_args.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/py_string.h"

namespace kiln::jinja {
namespace {

using TestFn = std::function<bool(const Value&, const CallArgs&, int)>;

// A test that takes no argument besides its subject.
TestFn unary(std::string name, std::function<bool(const Value&)> f) {
  return [name = std::move(name), f = std::move(f)](const Value& v, const CallArgs& a, int line) {
    BoundArgs(a, "test '" + name + "'", line, {});
    return f(v);
  };
}

// A test comparing its subject with one argument.
TestFn comparison(std::string name, std::string op) {
  return [name = std::move(name), op = std::move(op)](const Value& v, const CallArgs& a, int line) {
    BoundArgs args(a, "test '" + name + "'", line, {"other"});
    args.require(0, "other");
    return compare_op(op, v, args.get(0), line);
  };
}

bool is_integer_value(const Value& v) { return v.is_int(); }

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = {
      {"boolean", unary("boolean", [](const Value& v) { return v.is_bool(); })},
      {"callable", unary("callable", [](const Value& v) { return v.is_callable(); })},
      {"defined", unary("defined", [](const Value& v) { return !v.is_undefined(); })},
      {"divisibleby", [](const Value& v, const CallArgs& a, int line) {
         BoundArgs args(a, "test 'divisibleby'", line, {"num"});
         args.require(0, "num");
         return binary_op("%", v, args.get(0), line).to_double() == 0.0;
       }},
      {"eq", comparison("eq", "==")},
      {"equalto", comparison("equalto", "==")},
      {"==", comparison("==", "==")},
      {"escaped", unary("escaped", [](const Value&) { return false; })},
      {"even", [](const Value& v, const CallArgs& a, int line) {
         BoundArgs(a, "test 'even'", line, {});
         return binary_op("%", v, int64_t(2), line).to_double() == 0.0;
       }},
      {"false", unary("false", [](const Value& v) { return v.is_bool() && !v.as_bool(); })},
      {"float", unary("float", [](const Value& v) { return v.is_float(); })},
      {"ge", comparison("ge", ">=")},
      {">=", comparison(">=", ">=")},
      {"gt", comparison("gt", ">")},
      {">", comparison(">", ">")},
      {"greaterthan", comparison("greaterthan", ">")},
      {"in", [](const Value& v, const CallArgs& a, int line) {
         BoundArgs args(a, "test 'in'", line, {"seq"});
         args.require(0, "seq");
         return compare_op("in", v, args.get(0), line);
       }},
      {"integer", unary("integer", is_integer_value)},
      {"iterable", unary("iterable", [](const Value& v) {
         return v.is_undefined() || v.is_string() || v.is_list() || v.is_mapping();
       })},
      {"le", comparison("le", "<=")},
      {"<=", comparison("<=", "<=")},
      {"lower", unary("lower", [](const Value& v) {
         return v.is_string() && py::lower(v.as_string()) == v.as_string() && py::upper(v.as_string()) != v.as_string();
       })},
      {"lt", comparison("lt", "<")},
      {"<", comparison("<", "<")},
      {"lessthan", comparison("lessthan", "<")},
      {"mapping", unary("mapping", [](const Value& v) { return v.is_mapping(); })},
      {"ne", comparison("ne", "!=")},
      {"!=", comparison("!=", "!=")},
      {"none", unary("none", [](const Value& v) { return v.is_none(); })},
      {"number", unary("number", [](const Value& v) { return v.is_number(); })},
      {"odd", [](const Value& v, const CallArgs& a, int line) {
         BoundArgs(a, "test 'odd'", line, {});
         return binary_op("%", v, int64_t(2), line).to_double() == 1.0;
       }},
      {"sameas", [](const Value& v, const CallArgs& a, int line) {
         // Python's "is": singletons (None, True, False) and the same list/dict object.
         BoundArgs args(a, "test 'sameas'", line, {"other"});
         args.require(0, "other");
         const Value& o = args.get(0);
         if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
         if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
         if (v.is_list() && o.is_list()) return &v.as_list() == &o.as_list();
         if (v.is_dict() && o.is_dict()) return &v.as_dict() == &o.as_dict();
         return false;
       }},
      {"sequence", unary("sequence", [](const Value& v) {
         return v.is_undefined() || v.is_string() || v.is_list() || v.is_mapping();
       })},
      {"string", unary("string", [](const Value& v) { return v.is_string(); })},
      {"true", unary("true", [](const Value& v) { return v.is_bool() && v.as_bool(); })},
      {"undefined", unary("undefined", [](const Value& v) { return v.is_undefined(); })},
      {"upper", unary("upper", [](const Value& v) {
         return v.is_string() && py::upper(v.as_string()) == v.as_string() && py::lower(v.as_string()) != v.as_string();
       })},
  };
  return table;
}

}  // namespace

bool is_known_test(std::string_view name) { return tests().count(name) > 0; }

bool apply_test(const std::string& name, const Value& subject, const CallArgs& args, int line) {
  auto it = tests().find(name);
  KILN_CHECK(it != tests().end(), unsupported, "chat template line {}: the test '{}' is not supported", line, name);
  return it->second(subject, args, line);
}

}  // namespace kiln::jinja
