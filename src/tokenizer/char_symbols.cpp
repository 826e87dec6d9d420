#include "tokenizer/char_symbols.h"

#include <cstdio>

#include "tokenizer/utf8.h"

namespace kiln {

std::array<int32_t, 256> CharSymbolVocab::find_byte_tokens(const TokenIdMap& map) {
  std::array<int32_t, 256> out;
  for (int b = 0; b < 256; ++b) {
    char text[7];
    std::snprintf(text, sizeof text, "<0x%02X>", b);
    out[b] = lookup(map, std::string_view(text, 6));
  }
  return out;
}

void append_char_symbols(const CharSymbolVocab& vocab, std::string_view text, std::vector<int32_t>& out) {
  bool last_was_unk = false;
  size_t pos = 0;
  while (pos < text.size()) {
    const utf8::Scan sc = utf8::scan(text.substr(pos));
    const size_t len = sc.kind == utf8::Scan::valid ? sc.length : 1;
    const std::string_view ch = text.substr(pos, len);
    pos += len;
    if (const int32_t id = lookup(*vocab.tokens, ch); id >= 0) {
      out.push_back(id);
      last_was_unk = false;
      continue;
    }
    bool all_bytes = true;
    for (char c : ch) all_bytes = all_bytes && vocab.byte_tokens[uint8_t(c)] >= 0;
    if (all_bytes) {
      for (char c : ch) out.push_back(vocab.byte_tokens[uint8_t(c)]);
      last_was_unk = false;
      continue;
    }
    if (vocab.unk_id < 0) continue;
    if (!(vocab.fuse_unk && last_was_unk)) out.push_back(vocab.unk_id);
    last_was_unk = true;
  }
}

bool parse_byte_token(std::string_view text, uint8_t& byte) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return false;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]), lo = hex(text[4]);
  if (hi < 0 || lo < 0) return false;
  byte = uint8_t(hi * 16 + lo);
  return true;
}

}  // namespace kiln
