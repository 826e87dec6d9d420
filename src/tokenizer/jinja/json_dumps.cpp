// to_json: Python's json.dumps, which transformers' tojson filter calls (ensure_ascii=False and
// sort_keys=False by default, unlike Jinja's own tojson, which also HTML-escapes).
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/py_string.h"

namespace kiln::jinja {
namespace {

void append_u_escape(std::string& out, uint32_t unit) {
  static const char* hex = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += hex[(unit >> shift) & 15];
}

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (uint32_t cp : py::decode(s)) {
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20) {
          append_u_escape(out, cp);
        } else if (cp < 0x80 || !ensure_ascii) {
          out += py::encode({cp});
        } else if (cp < 0x10000) {
          append_u_escape(out, cp);
        } else {  // a UTF-16 surrogate pair, as Python writes astral characters
          const uint32_t v = cp - 0x10000;
          append_u_escape(out, 0xD800 + (v >> 10));
          append_u_escape(out, 0xDC00 + (v & 0x3FF));
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

class JsonWriter {
 public:
  JsonWriter(const JsonOptions& o, int line) : o_(o), line_(line) {
    item_sep_ = !o.item_separator.empty() ? o.item_separator : o.indent ? "," : ", ";
    key_sep_ = !o.key_separator.empty() ? o.key_separator : ": ";
  }

  void write(const Value& v, int level) {
    KILN_CHECK(level < kMaxPrintDepth, invalid_argument, "chat template line {}: tojson: value nested too deeply",
               line_);
    if (v.is_none()) {
      out += "null";
    } else if (v.is_bool()) {
      out += v.as_bool() ? "true" : "false";
    } else if (v.is_int()) {
      out += std::to_string(v.as_int());
    } else if (v.is_float()) {
      out += json_float(v.as_float());
    } else if (v.is_string()) {
      append_json_string(out, v.as_string(), o_.ensure_ascii);
    } else if (v.is_list()) {
      write_list(v.as_list(), level);
    } else if (v.is_mapping()) {
      write_dict(v.as_dict(), level);
    } else {
      KILN_FAIL(invalid_argument, "chat template line {}: tojson: Object of type {} is not JSON serializable", line_,
                v.type_name());
    }
    check_size();
  }

  std::string out;

 private:
  void newline(int level) {
    if (!o_.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) {
      out += *o_.indent;
      check_size();
    }
  }

  // A list can hold one big string many times by reference, and the indent repeats per level.
  void check_size() const {
    KILN_CHECK(out.size() <= kMaxValueBytes, invalid_argument, "chat template line {}: tojson output grew past {} MiB",
               line_, kMaxValueBytes >> 20);
  }

  void write_list(const List& l, int level) {
    if (l.items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    newline(level + 1);
    for (size_t i = 0; i < l.items.size(); ++i) {
      if (i) {
        out += item_sep_;
        newline(level + 1);
      }
      write(l.items[i], level + 1);
    }
    newline(level);
    out += ']';
  }

  std::string key_text(const Value& k) const {
    if (k.is_string()) return k.as_string();
    if (k.is_bool()) return k.as_bool() ? "true" : "false";
    if (k.is_int()) return std::to_string(k.as_int());
    if (k.is_float()) return json_float(k.as_float());
    if (k.is_none()) return "null";
    KILN_FAIL(invalid_argument, "chat template line {}: tojson: keys must be str, int, float, bool or None, not {}",
              line_, k.type_name());
  }

  void write_dict(const Dict& d, int level) {
    if (d.entries.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    for (const auto& e : d.entries) entries.push_back(&e);
    if (o_.sort_keys) {
      for (const auto* e : entries)
        KILN_CHECK(e->first.is_string(), unsupported, "chat template line {}: tojson(sort_keys=true) needs string keys",
                   line_);
      std::stable_sort(entries.begin(), entries.end(),
                       [](auto* a, auto* b) { return a->first.as_string() < b->first.as_string(); });
    }
    out += '{';
    newline(level + 1);
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) {
        out += item_sep_;
        newline(level + 1);
      }
      append_json_string(out, key_text(entries[i]->first), o_.ensure_ascii);
      out += key_sep_;
      write(entries[i]->second, level + 1);
    }
    newline(level);
    out += '}';
  }

  const JsonOptions& o_;
  int line_;
  std::string item_sep_, key_sep_;
};

}  // namespace

std::string to_json(const Value& value, const JsonOptions& options, int line) {
  JsonWriter w(options, line);
  w.write(value, 0);
  return std::move(w.out);
}

}  // namespace kiln::jinja
