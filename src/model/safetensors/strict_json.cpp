#include "model/safetensors/strict_json.h"

#include <set>
#include <vector>

#include "core/check.h"
#include "core/text_file.h"

namespace kiln {

size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // > U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

nlohmann::json parse_strict_json(std::string_view text, const std::string& what) {
  size_t bad = find_invalid_utf8(text);
  KILN_CHECK(bad == std::string_view::npos, invalid_model, "{} is not valid UTF-8 (byte {} of {})", what, bad,
             text.size());
  // One set of keys per open object; a key seen twice in the same object is an error.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open_objects.emplace_back();
    } else if (event == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == E::key && !open_objects.empty() && duplicate.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second) duplicate = key;
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL(invalid_model, "{} is not valid JSON: {}", what, e.what());
  }
  KILN_CHECK(duplicate.empty(), invalid_model, "{} has the key '{}' twice in one object; kiln refuses ambiguous files",
             what, duplicate);
  return j;
}

nlohmann::json read_strict_json_file(const std::string& path) {
  return parse_strict_json(read_text_file(path, "JSON file"), "'" + path + "'");
}

}  // namespace kiln
