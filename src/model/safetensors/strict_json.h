// Strict JSON for model files: valid UTF-8 checked first (so the error says so, not "syntax
// error"), then parsed with duplicate object keys rejected at every depth. nlohmann::json keeps
// the last of two equal keys silently; a safetensors header or config.json with two entries of
// one name is ambiguous (two readers may pick different ones), so kiln refuses it.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kiln {

// Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and > U+10FFFF
// included), or npos when `text` is valid.
size_t find_invalid_utf8(std::string_view text);

// Parses `text`; `what` names the document in errors ("safetensors header of 'x'", "config.json").
// Throws kiln::Error(invalid_model) for invalid UTF-8, a syntax error or a duplicate key.
nlohmann::json parse_strict_json(std::string_view text, const std::string& what);

// Reads and parses a whole file (io error when it cannot be read).
nlohmann::json read_strict_json_file(const std::string& path);

}  // namespace kiln
