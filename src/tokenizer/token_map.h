// Small things the tokenizers share: the token kinds GGUF records, a string -> id map that
// string_views can query without building a string, and string replacement.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kiln {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIdMap = std::unordered_map<std::string, int32_t, StringViewHash, std::equal_to<>>;

// Texts of the tokens that end a turn in the chat formats kiln serves (ChatML, Llama 3, Gemma, Phi,
// Llama 2 / Mistral, GPT-2 style documents): every tokenizer marks the ones its vocabulary has as
// end-of-generation, as llama.cpp does when a GGUF names no EOT id.
inline constexpr std::array<std::string_view, 7> kEndOfTurnTexts = {
    "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<end_of_turn>", "<|end|>",
};

// `s` with every occurrence of `from` (not empty) replaced by `to`: how SentencePiece spells
// spaces as "▁" and back.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

// The id `map` gives `text`, or -1.
inline int32_t lookup(const TokenIdMap& map, std::string_view text) {
  auto it = map.find(text);
  return it == map.end() ? -1 : it->second;
}

}  // namespace kiln
