// The starting point of SentencePiece-style BPE: one symbol per UTF-8 character, before any merge.
// A character the vocabulary lacks becomes the byte tokens "<0xXX>" of its bytes (byte fallback,
// Llama 2 / Mistral), or the unknown token when byte fallback is off or a byte token is missing
// (Hugging Face BPE; with fuse_unk, a run of unknown characters is one unknown token).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/token_map.h"

namespace kiln {

struct CharSymbolVocab {
  const TokenIdMap* tokens = nullptr;  // text -> id
  std::array<int32_t, 256> byte_tokens;  // "<0xXX>" ids; all -1 when byte fallback is off
  int32_t unk_id = -1;  // -1: characters with no token are dropped (Hugging Face without unk_token)
  bool fuse_unk = false;

  // byte_tokens from the "<0xXX>" tokens of `map` (-1 for each one it lacks).
  static std::array<int32_t, 256> find_byte_tokens(const TokenIdMap& map);
};

// Appends the initial symbols of `text`. Bytes that are not valid UTF-8 are one symbol each.
void append_char_symbols(const CharSymbolVocab& vocab, std::string_view text, std::vector<int32_t>& out);

// Whether a token text is a byte token "<0xXX>"; `byte` gets its value.
bool parse_byte_token(std::string_view text, uint8_t& byte);

}  // namespace kiln
