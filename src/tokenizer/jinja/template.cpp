#include "tokenizer/jinja/template.h"

#include <unordered_map>

#include "core/check.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/globals.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/parser.h"

namespace kiln::jinja {
namespace {

// Limits that turn a runaway template (an endless macro recursion, loops nested over big ranges)
// into an error instead of a crash or a hang.
constexpr int kMaxCallDepth = 100;
constexpr int64_t kMaxSteps = 1'000'000;  // a 10,000-message chat takes about 300,000

// Variables visible at one point of the template. Jinja gives each for-loop iteration and each
// macro call its own scope: {% set %} there does not leak out (namespace() exists for that),
// while {% if %} blocks share their enclosing scope.
struct Scope {
  explicit Scope(const Scope* parent) : parent(parent) {}
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
  const Scope* parent;
  std::unordered_map<std::string, Value> vars;
};

class Renderer {
 public:
  Renderer(const std::map<std::string, Value>& variables) : globals_(nullptr), root_(&globals_) {
    std::map<std::string, Value> all = variables;
    add_globals(all);
    for (auto& [k, v] : all) globals_.vars.emplace(k, v);
  }

  std::string render(const Body& body) {
    std::string out;
    out_ = &out;
    exec_body(body, root_);
    return out;
  }

 private:
  enum class Flow { normal, break_loop, continue_loop };

  void step(int line) {
    KILN_CHECK(++steps_ <= kMaxSteps, invalid_argument,
               "chat template line {}: rendering took more than {} steps; is there a runaway loop?", line, kMaxSteps);
  }

  void emit(const std::string& s, int line) {
    out_->append(s);
    KILN_CHECK(out_->size() <= kMaxValueBytes, invalid_argument, "chat template line {}: output grew past {} MiB",
               line, kMaxValueBytes >> 20);
  }

  Flow exec_body(const Body& body, Scope& scope) {
    for (const StmtPtr& s : body) {
      const Flow f = exec(*s, scope);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow exec(const Stmt& s, Scope& scope) {
    step(s.line);
    switch (s.kind) {
      case Stmt::Kind::text: emit(s.text, s.line); break;
      case Stmt::Kind::print: emit(to_str(eval(*s.expr, scope)), s.line); break;
      case Stmt::Kind::if_:
        for (const auto& branch : s.branches)
          if (eval(*branch.condition, scope).truthy()) return exec_body(branch.body, scope);
        return exec_body(s.else_body, scope);
      case Stmt::Kind::for_: exec_for(s, scope); break;
      case Stmt::Kind::set: exec_set(s, scope); break;
      case Stmt::Kind::set_block: scope.vars[s.targets[0]] = capture(s.body, scope); break;
      case Stmt::Kind::macro: define_macro(s, scope); break;
      case Stmt::Kind::break_: return Flow::break_loop;
      case Stmt::Kind::continue_: return Flow::continue_loop;
      case Stmt::Kind::block: return exec_body(s.body, scope);
    }
    return Flow::normal;
  }

  // Renders `body` into a string instead of the output ({% set x %}...{% endset %}, macros).
  std::string capture(const Body& body, Scope& scope) {
    std::string buffer;
    std::string* saved = out_;
    out_ = &buffer;
    try {
      exec_body(body, scope);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buffer;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& value, Scope& scope, int line) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = value;
      return;
    }
    KILN_CHECK(value.is_list(), invalid_argument, "chat template line {}: cannot unpack a {} into {} names", line,
               value.type_name(), targets.size());
    const auto& items = value.as_list().items;
    KILN_CHECK(items.size() == targets.size(), invalid_argument,
               "chat template line {}: {} values to unpack into {} names", line, items.size(), targets.size());
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  void exec_set(const Stmt& s, Scope& scope) {
    Value value = eval(*s.expr, scope);
    if (s.object.empty()) {
      bind_targets(s.targets, value, scope, s.line);
      return;
    }
    const Value* target = scope.find(s.object);
    KILN_CHECK(target && target->is_dict() && target->as_dict().is_namespace, invalid_argument,
               "chat template line {}: cannot assign attribute on non-namespace object '{}'", s.line, s.object);
    KILN_CHECK(s.attribute[0] != '_', invalid_argument,
               "chat template line {}: chat templates cannot store underscore-prefixed attributes on a namespace, "
               "but got '{}'",
               s.line, s.attribute);
    target->as_dict().set(Value(s.attribute), std::move(value));
  }

  // The `loop` variable of one iteration (loop.index, loop.first, loop.cycle(...), ...).
  static Value loop_info(size_t i, const std::vector<Value>& items) {
    const auto n = int64_t(items.size()), k = int64_t(i);
    Value loop = Value::dict();
    auto& e = loop.as_dict().entries;  // distinct keys: append without Dict::set's lookup
    e.reserve(12);
    e.emplace_back("index", k + 1);
    e.emplace_back("index0", k);
    e.emplace_back("revindex", n - k);
    e.emplace_back("revindex0", n - k - 1);
    e.emplace_back("first", k == 0);
    e.emplace_back("last", k == n - 1);
    e.emplace_back("length", n);
    e.emplace_back("depth", int64_t(1));
    e.emplace_back("depth0", int64_t(0));
    e.emplace_back("previtem", k > 0 ? items[i - 1] : Value(Undefined{"'loop.previtem' is undefined"}));
    e.emplace_back("nextitem", k + 1 < n ? items[i + 1] : Value(Undefined{"'loop.nextitem' is undefined"}));
    e.emplace_back("cycle", Value::function("loop.cycle", [k](const CallArgs& a) {
                     KILN_CHECK(!a.positional.empty(), invalid_argument, "loop.cycle() needs at least one value");
                     return a.positional[size_t(k) % a.positional.size()];
                   }));
    return loop;
  }

  void exec_for(const Stmt& s, Scope& scope) {
    std::vector<Value> items = iterate(eval(*s.expr, scope), s.line);
    if (s.condition) {  // "for x in xs if cond": filter first, so loop.length and loop.last count survivors
      std::vector<Value> kept;
      for (Value& item : items) {
        Scope probe(&scope);
        bind_targets(s.targets, item, probe, s.line);
        if (eval(*s.condition, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Scope else_scope(&scope);
      exec_body(s.else_body, else_scope);
      return;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      step(s.line);
      Scope iteration(&scope);
      bind_targets(s.targets, items[i], iteration, s.line);
      iteration.vars["loop"] = loop_info(i, items);
      if (exec_body(s.body, iteration) == Flow::break_loop) break;
    }
  }

  void define_macro(const Stmt& s, Scope& scope) {
    const Stmt* macro = &s;
    scope.vars[s.name] = Value::function(s.name, [this, macro](const CallArgs& args) { return call_macro(*macro, args); });
  }

  Value call_macro(const Stmt& m, const CallArgs& args) {
    KILN_CHECK(++call_depth_ <= kMaxCallDepth, invalid_argument,
               "chat template line {}: macro calls nested more than {} deep", m.line, kMaxCallDepth);
    struct DepthGuard {
      int& depth;
      ~DepthGuard() { --depth; }
    } guard{call_depth_};
    KILN_CHECK(args.positional.size() <= m.params.size(), invalid_argument,
               "chat template line {}: macro '{}' takes {} argument(s), got {}", m.line, m.name, m.params.size(),
               args.positional.size());
    Scope scope(root_);
    std::vector<bool> bound(m.params.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      scope.vars[m.params[i].name] = args.positional[i];
      bound[i] = true;
    }
    for (const auto& [key, value] : args.keyword) {
      size_t i = 0;
      while (i < m.params.size() && m.params[i].name != key) ++i;
      KILN_CHECK(i < m.params.size(), invalid_argument, "chat template line {}: macro '{}' has no parameter '{}'",
                 m.line, m.name, key);
      scope.vars[key] = value;
      bound[i] = true;
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (bound[i]) continue;
      const auto& p = m.params[i];
      scope.vars[p.name] = p.default_value ? eval(*p.default_value, scope)
                                           : Value(Undefined{fmt::format("'{}' is undefined", p.name)});
    }
    return capture(m.body, scope);
  }

  CallArgs eval_arguments(const Expr& e, size_t first, Scope& scope) {
    CallArgs args;
    for (size_t i = first; i < e.operands.size(); ++i) args.positional.push_back(eval(*e.operands[i], scope));
    for (const auto& [key, value] : e.keywords) args.keyword.emplace_back(key, eval(*value, scope));
    return args;
  }

  static std::optional<int64_t> slice_bound(const Value& v, int line) {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    KILN_CHECK(v.is_int() || v.is_bool(), invalid_argument, "chat template line {}: slice indices must be integers, not {}",
               line, v.type_name());
    return v.to_int();
  }

  Value eval_call(const Expr& e, Scope& scope) {
    const Expr& callee = *e.operands[0];
    if (callee.kind == Expr::Kind::attribute) {  // a method call: x.strip(), ns.items(), loop.cycle(...)
      const Value object = eval(*callee.operands[0], scope);
      if (object.is_dict()) {
        const Value* member = object.as_dict().find(Value(callee.name));
        if (member && member->is_callable()) return member->as_callable().call(eval_arguments(e, 1, scope));
      }
      if (object.is_undefined()) fail_undefined(object.as_undefined(), e.line);
      return call_method(object, callee.name, eval_arguments(e, 1, scope), e.line);
    }
    const Value f = eval(callee, scope);
    if (f.is_undefined()) fail_undefined(f.as_undefined(), e.line);
    if (!f.is_callable()) fail_type(e.line, fmt::format("'{}' object is not callable", f.type_name()));
    return f.as_callable().call(eval_arguments(e, 1, scope));
  }

  Value eval(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value(Undefined{fmt::format("'{}' is undefined", e.name)});
      }
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        std::vector<Value> items;
        for (const auto& op : e.operands) items.push_back(eval(*op, scope));
        return Value::list(std::move(items), e.kind == Expr::Kind::tuple);
      }
      case Expr::Kind::dict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2)
          d.as_dict().set(eval(*e.operands[i], scope), eval(*e.operands[i + 1], scope));
        return d;
      }
      case Expr::Kind::attribute: return get_attribute(eval(*e.operands[0], scope), e.name, e.line);
      case Expr::Kind::subscript: return get_item(eval(*e.operands[0], scope), eval(*e.operands[1], scope), e.line);
      case Expr::Kind::slice: {
        const Value object = eval(*e.operands[0], scope);
        std::optional<int64_t> bounds[3];
        for (int i = 0; i < 3; ++i)
          if (e.operands[size_t(i) + 1]) bounds[i] = slice_bound(eval(*e.operands[size_t(i) + 1], scope), e.line);
        return get_slice(object, bounds[0], bounds[1], bounds[2], e.line);
      }
      case Expr::Kind::call: return eval_call(e, scope);
      case Expr::Kind::filter:
        return apply_filter(e.name, eval(*e.operands[0], scope), eval_arguments(e, 1, scope), e.line);
      case Expr::Kind::test: {
        const bool result = apply_test(e.name, eval(*e.operands[0], scope), eval_arguments(e, 1, scope), e.line);
        return e.negated ? !result : result;
      }
      case Expr::Kind::unary: {
        const Value v = eval(*e.operands[0], scope);
        if (e.name == "not") return !v.truthy();
        if (v.is_undefined()) fail_undefined(v.as_undefined(), e.line);
        if (!v.is_number()) fail_type(e.line, fmt::format("bad operand type for unary {}: '{}'", e.name, v.type_name()));
        if (e.name == "+") return v.is_float() ? v : Value(v.to_int());
        return v.is_float() ? Value(-v.as_float()) : Value(int_negate(v.to_int(), e.line));
      }
      case Expr::Kind::binary: {
        if (e.name == "and" || e.name == "or") {  // Python returns the deciding operand, not a bool
          Value left = eval(*e.operands[0], scope);
          if (left.truthy() == (e.name == "or")) return left;
          return eval(*e.operands[1], scope);
        }
        return binary_op(e.name, eval(*e.operands[0], scope), eval(*e.operands[1], scope), e.line);
      }
      case Expr::Kind::compare: {
        Value left = eval(*e.operands[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.operands[i + 1], scope);
          if (!compare_op(e.ops[i], left, right, e.line)) return false;
          left = std::move(right);
        }
        return true;
      }
      case Expr::Kind::conditional:
        if (eval(*e.operands[1], scope).truthy()) return eval(*e.operands[0], scope);
        if (e.operands[2]) return eval(*e.operands[2], scope);
        return Undefined{"the value of an 'if' expression without 'else'"};
    }
    KILN_FAIL(internal, "chat template line {}: unknown expression kind", e.line);
  }

  Scope globals_;
  Scope root_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

Template::Template(std::string_view source) : body_(std::make_shared<const Body>(parse_template(source))) {}

std::string Template::render(const std::map<std::string, Value>& variables) const {
  return Renderer(variables).render(*body_);
}

}  // namespace kiln::jinja
