// Byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM): raw text -> special tokens and text -> pre-token
// pieces -> bytes spelled in GPT-2's byte alphabet -> merges applied by rank within each piece.
//
// The merge loop is the one Hugging Face tokenizers and llama.cpp run: repeatedly merge the
// adjacent pair with the best (lowest) rank, the leftmost one on ties, until no pair has a rank.
// Pairs are keyed by token ids, so a merge is a hash lookup and no strings are built.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/merge_table.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/token_map.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

// Everything a byte-level BPE tokenizer is built from, as GGUF stores it.
struct BpeVocab {
  std::vector<std::string> tokens;  // each token's spelling (byte-level for ordinary tokens)
  std::vector<TokenType> types;     // one per token; empty means all normal
  std::vector<std::string> merges;  // "left right", best rank first
  std::string pre = "gpt2";         // tokenizer.ggml.pre
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  std::vector<int32_t> extra_end_ids;  // tokenizer.ggml.eot_token_id, eom_token_id, ...
  bool add_bos = false;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Validates the vocabulary (kiln::Error invalid_model: ids out of range, a merge without a space) and builds the lookup tables; unknown `pre` throws unsupported.
  explicit BpeTokenizer(BpeVocab vocab);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return int32_t(tokens_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool add_bos_default() const override { return add_bos_; }
  bool is_end_of_generation(int32_t id) const override;
  int32_t find_token(std::string_view text) const override;

  // Appends the ids of one pre-token piece (raw bytes): the BPE merge loop.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  std::vector<std::string> tokens_;  // spelling, as in the vocabulary
  std::vector<std::string> bytes_;   // what each token decodes to
  TokenIdMap id_of_;
  MergeTable merges_;
  int32_t byte_token_[256];  // the single-byte token of each byte, -1 when the vocabulary lacks it
  std::vector<bool> end_of_generation_;
  PreTokenizer pretokenizer_;
  bool ignore_merges_ = false;
  SpecialTokenMatcher special_tokens_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
};

}  // namespace kiln
