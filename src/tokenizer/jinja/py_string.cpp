#include "tokenizer/jinja/py_string.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace kiln::jinja::py {

// Invalid bytes travel as lone surrogates U+DC80..U+DCFF, Python's "surrogateescape" trick, so
// that encode(decode(s)) == s for any bytes.
static constexpr uint32_t kEscapedByte = 0xDC00;

std::vector<uint32_t> decode(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const auto b0 = uint8_t(s[pos]);
    if (b0 < 0x80) {
      cps.push_back(b0);
      ++pos;
      continue;
    }
    const utf8::Scan scan = utf8::scan(s.substr(pos));
    if (scan.kind != utf8::Scan::valid) {
      cps.push_back(kEscapedByte + b0);
      ++pos;
      continue;
    }
    uint32_t cp = b0 & (0xFF >> (scan.length + 1));
    for (size_t i = 1; i < scan.length; ++i) cp = (cp << 6) | (uint8_t(s[pos + i]) & 0x3F);
    cps.push_back(cp);
    pos += scan.length;
  }
  return cps;
}

std::string encode(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) {
    if (cp >= kEscapedByte + 0x80 && cp <= kEscapedByte + 0xFF)
      out += char(cp - kEscapedByte);
    else
      utf8::append(out, cp);
  }
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;  // count every byte that is not a continuation
  // Invalid sequences can make this differ from decode().size(); only exact for valid UTF-8.
  if (utf8::valid_prefix_length(s) != s.size()) return decode(s).size();
  return n;
}

bool is_space(uint32_t cp) {
  // Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<uint32_t> cps = decode(s);
  std::vector<uint32_t> set;
  if (chars) set = decode(*chars);
  auto strippable = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_space(cp);
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  return encode(std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end));
}

// split() with no separator: runs of whitespace separate, leading/trailing runs are dropped.
static std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::vector<uint32_t> cps = decode(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  std::vector<std::string> parts;
  size_t i = 0;
  const size_t n = cps.size();
  while (i < n) {
    while (i < n && is_space(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
      size_t end = n;
      while (end > i && is_space(cps[end - 1])) --end;  // Python keeps the rest, minus trailing space
      std::vector<uint32_t> rest(cps.begin() + i, cps.begin() + end);
      if (from_right) std::reverse(rest.begin(), rest.end());
      parts.push_back(encode(rest));
      break;
    }
    size_t start = i;
    while (i < n && !is_space(cps[i])) ++i;
    std::vector<uint32_t> word(cps.begin() + start, cps.begin() + i);
    if (from_right) std::reverse(word.begin(), word.end());
    parts.push_back(encode(word));
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit, false);
  std::vector<std::string> parts;
  size_t pos = 0;
  while (maxsplit < 0 || int64_t(parts.size()) < maxsplit) {
    size_t hit = s.find(*sep, pos);
    if (hit == std::string_view::npos) break;
    parts.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep->size();
  }
  parts.emplace_back(s.substr(pos));
  return parts;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit, true);
  std::vector<std::string> parts;
  size_t end = s.size();
  while (maxsplit < 0 || int64_t(parts.size()) < maxsplit) {
    if (end < sep->size()) break;
    size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> splitlines(std::string_view s) {
  const std::vector<uint32_t> cps = decode(s);
  std::vector<std::string> lines;
  std::vector<uint32_t> line;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const bool is_break = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
                          cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) {
      line.push_back(cp);
      continue;
    }
    if (cp == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    lines.push_back(encode(line));
    line.clear();
  }
  if (!line.empty()) lines.push_back(encode(line));
  return lines;
}

std::optional<std::string> replace(std::string_view s, std::string_view old, std::string_view with, int64_t count,
                                   size_t max_bytes) {
  std::string out;
  if (old.empty()) {
    const std::vector<uint32_t> cps = decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < cps.size()) out += encode({cps[i]});
      if (out.size() > max_bytes) return std::nullopt;
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(with);
    if (out.size() > max_bytes) return std::nullopt;
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  if (out.size() > max_bytes) return std::nullopt;
  return out;
}

static bool is_ascii_upper(char c) { return c >= 'A' && c <= 'Z'; }
static bool is_ascii_lower(char c) { return c >= 'a' && c <= 'z'; }
static char to_upper(char c) { return is_ascii_lower(c) ? char(c - 32) : c; }
static char to_lower(char c) { return is_ascii_upper(c) ? char(c + 32) : c; }

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_upper(c);
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_lower(c);
  return out;
}

std::string title(std::string_view s) {
  // Python: a cased character after an uncased one starts a word and is upper-cased.
  std::string out(s);
  bool previous_cased = false;
  for (char& c : out) {
    const bool cased = is_ascii_upper(c) || is_ascii_lower(c);
    c = cased ? (previous_cased ? to_lower(c) : to_upper(c)) : c;
    previous_cased = cased;
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = to_upper(out[0]);
  return out;
}

std::vector<int64_t> slice_indices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   std::optional<int64_t> step) {
  // CPython's PySlice_AdjustIndices.
  const int64_t st = step.value_or(1);
  std::vector<int64_t> out;
  if (st == 0) return out;  // the caller rejects a zero step before calling
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < lo) x = lo;
    } else if (x > hi) {
      x = hi;
    }
    return x;
  };
  if (st > 0) {
    const int64_t b = adjust(start, 0, 0, n), e = adjust(stop, n, 0, n);
    for (int64_t i = b; i < e; i += st) {  // (i + st is only formed below e: no overflow)
      out.push_back(i);
      if (st >= e - i) break;
    }
  } else {
    const int64_t b = adjust(start, n - 1, -1, n - 1), e = adjust(stop, -1, -1, n - 1);
    for (int64_t i = b; i > e; i += st) {  // (i + st is only formed above e: no overflow)
      out.push_back(i);
      if (st <= e - i) break;
    }
  }
  return out;
}

static bool is_printable(uint32_t cp) {
  // The code points Python's repr() escapes: controls, and separators/format characters other than
  // the plain space (a close approximation of "not str.isprintable()").
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp >= kEscapedByte + 0x80 && cp <= kEscapedByte + 0xFF) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
      (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF)
    return false;
  return true;
}

std::string repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  static const char* hex = "0123456789abcdef";
  for (uint32_t cp : decode(s)) {
    if (cp == uint32_t(quote) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (is_printable(cp)) {
      utf8::append(out, cp);
    } else if (cp <= 0xFF || (cp >= kEscapedByte + 0x80 && cp <= kEscapedByte + 0xFF)) {
      const uint32_t b = cp & 0xFF;
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 15];
    } else {
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += hex[(cp >> shift) & 15];
    }
  }
  out += quote;
  return out;
}

}  // namespace kiln::jinja::py
