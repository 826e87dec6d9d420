#include "tokenizer/utf8.h"

namespace kiln::utf8 {

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

Scan scan(std::string_view bytes) {
  const auto b0 = uint8_t(bytes[0]);
  if (b0 < 0x80) return {Scan::valid, 1};
  // The lead byte fixes the length and the allowed range of the second byte; the narrower ranges
  // exclude overlong forms, surrogates and code points above U+10FFFF (Unicode Table 3-7).
  size_t length = 0;
  uint8_t second_lo = 0x80, second_hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) second_lo = 0xA0;
    if (b0 == 0xED) second_hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) second_lo = 0x90;
    if (b0 == 0xF4) second_hi = 0x8F;
  } else {
    return {Scan::invalid, 1};  // a continuation byte, C0/C1, or F5..FF
  }
  for (size_t i = 1; i < length; ++i) {
    if (i >= bytes.size()) return {Scan::incomplete, i};
    const auto b = uint8_t(bytes[i]);
    const uint8_t lo = i == 1 ? second_lo : 0x80;
    const uint8_t hi = i == 1 ? second_hi : 0xBF;
    if (b < lo || b > hi) return {Scan::invalid, i};
  }
  return {Scan::valid, length};
}

size_t valid_prefix_length(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (uint8_t(bytes[pos]) < 0x80) {  // ASCII fast path: most text is mostly ASCII
      ++pos;
      continue;
    }
    const Scan s = scan(bytes.substr(pos));
    if (s.kind != Scan::valid) break;
    pos += s.length;
  }
  return pos;
}

size_t append_replacing_invalid(std::string& out, std::string_view bytes, bool final) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t valid = valid_prefix_length(bytes.substr(pos));
    out.append(bytes.substr(pos, valid));
    pos += valid;
    if (pos == bytes.size()) break;
    const Scan s = scan(bytes.substr(pos));
    if (s.kind == Scan::incomplete && !final) break;  // wait for the bytes that complete it
    out.append(kReplacement);
    pos += s.length;
  }
  return pos;
}

}  // namespace kiln::utf8
