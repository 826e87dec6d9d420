#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace kiln::byte_level {
namespace {

// The highest code point of the alphabet: 256 + the 68 bytes that are not printable Latin-1 - 1.
constexpr uint32_t kMaxCodePoint = 0x143;

struct Tables {
  std::array<uint32_t, 256> code_point_of_byte{};
  std::array<int16_t, kMaxCodePoint + 1> byte_of_code_point{};
  std::array<std::string, 256> spelling{};

  Tables() {
    byte_of_code_point.fill(-1);
    // Printable bytes keep their Latin-1 code point: '!'..'~', '¡'..'¬', '®'..'ÿ'.
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? uint32_t(b) : next_extra++;
      code_point_of_byte[b] = cp;
      byte_of_code_point[cp] = int16_t(b);
      utf8::append(spelling[b], cp);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_code_point(uint8_t byte) { return tables().code_point_of_byte[byte]; }

int code_point_to_byte(uint32_t code_point) {
  return code_point <= kMaxCodePoint ? tables().byte_of_code_point[code_point] : -1;
}

std::string_view spell_byte(uint8_t byte) { return tables().spelling[byte]; }

std::string encode(std::string_view raw) {
  const Tables& t = tables();
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) out += t.spelling[uint8_t(c)];
  return out;
}

std::string decode(std::string_view spelled) {
  const Tables& t = tables();
  std::string out;
  out.reserve(spelled.size());
  size_t pos = 0;
  while (pos < spelled.size()) {
    const auto b0 = uint8_t(spelled[pos]);
    // Every code point of the alphabet is at most U+0143: one byte, or two with lead C2..C5.
    if (b0 < 0x80) {
      const int byte = t.byte_of_code_point[b0];
      if (byte >= 0) {
        out += char(byte);
      } else {
        out += char(b0);  // a control character or space: not byte-level, keep as is
      }
      ++pos;
      continue;
    }
    const utf8::Scan s = utf8::scan(spelled.substr(pos));
    if (s.kind == utf8::Scan::valid && s.length == 2) {
      const uint32_t cp = (uint32_t(b0 & 0x1F) << 6) | (uint8_t(spelled[pos + 1]) & 0x3F);
      const int byte = code_point_to_byte(cp);
      if (byte >= 0) {
        out += char(byte);
        pos += 2;
        continue;
      }
    }
    const size_t n = s.kind == utf8::Scan::valid ? s.length : 1;
    out.append(spelled.substr(pos, n));
    pos += n;
  }
  return out;
}

}  // namespace kiln::byte_level
