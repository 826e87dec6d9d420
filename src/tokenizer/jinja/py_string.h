// Python str semantics over UTF-8 bytes. Templates index, slice, measure and strip strings the
// way Python does, by code point and with Unicode's idea of whitespace; getting that wrong changes
// the rendered prompt (e.g. strip() removes a trailing U+3000 IDEOGRAPHIC SPACE).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja::py {

// Code points of UTF-8 text; an invalid byte becomes one code point of its own value (kept
// through encode() unchanged), so no input is lost.
std::vector<uint32_t> decode(std::string_view s);
std::string encode(const std::vector<uint32_t>& cps);
size_t length(std::string_view s);  // len(s): code points

bool is_space(uint32_t cp);  // str.isspace()

// str.strip/lstrip/rstrip: `chars` absent strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep=None, maxsplit=-1) and str.rsplit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s);
// str.replace(old, new, count=-1); an empty `old` inserts `new` between code points, as Python does.
// Nothing when the result would pass max_bytes (its size grows with the matches, so a caller
// cannot bound it from the arguments alone).
std::optional<std::string> replace(std::string_view s, std::string_view old, std::string_view with, int64_t count,
                                   size_t max_bytes);

// Case mapping covers ASCII only; other letters are left as they are.
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);
std::string capitalize(std::string_view s);

// Python's slice s[start:stop:step] on a sequence of `n` items: the indices it selects.
std::vector<int64_t> slice_indices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   std::optional<int64_t> step);

// repr() of a str: quotes chosen as Python chooses them, control characters escaped.
std::string repr(std::string_view s);

}  // namespace kiln::jinja::py
