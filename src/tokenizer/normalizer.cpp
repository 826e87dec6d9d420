#include "tokenizer/normalizer.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

#include "core/check.h"
#include "tokenizer/token_map.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (uint8_t(c) >= 0x80) return false;
  }
  return true;
}

void append_nfc_of_valid(std::string& out, std::string_view valid) {
  if (valid.empty()) return;
  // ASCII is already in NFC; most text is, so skip the library call and its allocation.
  if (is_ascii(valid)) {
    out += valid;
    return;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()),
                                          utf8proc_ssize_t(valid.size()), &result,
                                          utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  KILN_CHECK(n >= 0, internal, "NFC of valid UTF-8 failed: {}", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  out.append(reinterpret_cast<const char*>(result), size_t(n));
}

}  // namespace

std::string nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t valid = utf8::valid_prefix_length(text.substr(pos));
    append_nfc_of_valid(out, text.substr(pos, valid));
    pos += valid;
    if (pos < text.size()) {
      // Keep the invalid bytes (one maximal subpart) untouched and go on after them.
      const utf8::Scan bad = utf8::scan(text.substr(pos));
      out.append(text.substr(pos, bad.length));
      pos += bad.length;
    }
  }
  return out;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::nfc:
        s = nfc(s);
        break;
      case Step::prepend:
        if (!s.empty()) s.insert(0, step.content);
        break;
      case Step::replace:
        if (!step.pattern.empty()) s = replace_all(s, step.pattern, step.content);
        break;
    }
  }
  return s;
}

}  // namespace kiln
