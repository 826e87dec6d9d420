// SentencePiece BPE as GGUF stores it (tokenizer.ggml.model = "llama": Llama 2, Mistral,
// TinyLlama), encoded the way llama.cpp's SPM tokenizer does:
//
//   spaces are spelled U+2581 "▁"; a "▁" is prepended to the text and after every special token
//   (tokenizer.ggml.add_space_prefix); the text is cut into UTF-8 characters; adjacent symbols
//   whose concatenation is a token merge, the pair with the highest token score first (the
//   leftmost on ties); characters the vocabulary lacks become their "<0xXX>" byte tokens.
//
// There are no merge rules in the file: kiln derives them from the scores once, at load. Every
// way of splitting a token's text into two tokens becomes a merge whose rank is the token's score
// rank (equal scores share a rank, so ties still go to the leftmost pair), and then runs the same
// rank-ordered merge loop as byte-level BPE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/char_symbols.h"
#include "tokenizer/merge_table.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/token_map.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct SpmVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;     // one per token; higher merges first
  std::vector<TokenType> types;  // one per token; empty means all normal
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  std::vector<int32_t> extra_end_ids;
  bool add_bos = true;
  bool add_space_prefix = true;
};

class SpmTokenizer final : public Tokenizer {
 public:
  // Throws kiln::Error(invalid_model) for an inconsistent vocabulary (sizes, ids out of range).
  explicit SpmTokenizer(SpmVocab vocab);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return int32_t(bytes_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool add_bos_default() const override { return add_bos_; }
  bool is_end_of_generation(int32_t id) const override;
  int32_t find_token(std::string_view text) const override { return lookup(id_of_, text); }
  bool decode_strips_leading_space() const override { return add_space_prefix_; }

 private:
  void encode_text(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;

  std::vector<std::string> bytes_;  // what each token decodes to
  TokenIdMap id_of_;
  MergeTable merges_;
  CharSymbolVocab symbols_;
  SpecialTokenMatcher special_tokens_;
  std::vector<bool> end_of_generation_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = true;
  bool add_space_prefix_ = true;
};

}  // namespace kiln
