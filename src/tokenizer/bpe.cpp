#include "tokenizer/bpe.h"

#include <array>

#include "core/check.h"
#include "tokenizer/token_map.h"
#include "tokenizer/byte_level.h"

namespace kiln {
namespace {

bool is_added_token(TokenType type) { return type == TokenType::control || type == TokenType::user_defined; }

TokenType type_of(const BpeVocab& vocab, size_t id) {
  return vocab.types.empty() ? TokenType::normal : vocab.types[id];
}

std::vector<SpecialTokenMatcher::Token> added_tokens(const BpeVocab& vocab) {
  std::vector<SpecialTokenMatcher::Token> out;
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    const TokenType type = type_of(vocab, id);
    if (is_added_token(type)) out.push_back({vocab.tokens[id], int32_t(id), type == TokenType::control});
  }
  return out;
}

// Validates before any member is built, so the constructor's initializers may trust the vocabulary.
const BpeVocab& validated(const BpeVocab& vocab) {
  const size_t n = vocab.tokens.size();
  KILN_CHECK(n > 0, invalid_model, "the tokenizer vocabulary is empty");
  KILN_CHECK(n <= size_t(INT32_MAX), invalid_model, "the tokenizer vocabulary has {} tokens (too many)", n);
  KILN_CHECK(vocab.types.empty() || vocab.types.size() == n, invalid_model,
             "tokenizer.ggml.token_type has {} entries for {} tokens", vocab.types.size(), n);
  auto check_id = [&](int32_t id, std::string_view what) {
    KILN_CHECK(id >= -1 && id < int64_t(n), invalid_model, "the {} token id {} is outside the vocabulary (0..{})", what,
               id, n - 1);
  };
  check_id(vocab.bos_id, "BOS");
  check_id(vocab.eos_id, "EOS");
  for (int32_t id : vocab.extra_end_ids) check_id(id, "end-of-turn");
  return vocab;
}

}  // namespace

BpeTokenizer::BpeTokenizer(BpeVocab vocab)
    : pretokenizer_(pretokenizer_config(validated(vocab).pre).regexes),
      ignore_merges_(pretokenizer_config(vocab.pre).ignore_merges),
      special_tokens_(added_tokens(vocab)),
      bos_id_(vocab.bos_id),
      eos_id_(vocab.eos_id),
      add_bos_(vocab.add_bos) {
  const size_t n = vocab.tokens.size();
  id_of_.reserve(n);
  bytes_.resize(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = vocab.tokens[id];
    // A later duplicate wins, as in llama.cpp (token_to_id[word] = i) and a Python dict.
    id_of_[text] = int32_t(id);
    // Added tokens are stored as the raw text they match; the others are spelled byte-level.
    bytes_[id] = is_added_token(type_of(vocab, id)) ? text : byte_level::decode(text);
  }

  for (int b = 0; b < 256; ++b) {
    // Real vocabularies lack a few bytes (SmolLM2 has no token for 21 of them, e.g. 0x04 and
    // 0xFF); encode_piece drops such bytes, as Hugging Face and llama.cpp do.
    byte_token_[b] = find_token(byte_level::spell_byte(uint8_t(b)));
  }

  merges_ = MergeTable(vocab.merges.size());
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    // Split at the first space after the first character, as llama.cpp does: a byte-level
    // spelling never holds a space, so this is the separator.
    const size_t space = merge.find(' ', 1);
    KILN_CHECK(space != std::string::npos, invalid_model, "tokenizer merge {} ('{}') has no space between its parts",
               rank, merge);
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right = std::string_view(merge).substr(space + 1);
    const int32_t left_id = find_token(left), right_id = find_token(right);
    std::string joined;
    joined.reserve(left.size() + right.size());
    joined.append(left).append(right);
    const int32_t result = find_token(joined);
    // A merge naming tokens the vocabulary lacks can never apply; converters leave a few behind.
    if (left_id < 0 || right_id < 0 || result < 0) continue;
    merges_.insert(left_id, right_id, {int32_t(rank), result});  // the first rank of a pair wins
  }

  tokens_ = std::move(vocab.tokens);
  end_of_generation_.assign(n, false);
  if (eos_id_ >= 0) end_of_generation_[eos_id_] = true;
  for (int32_t id : vocab.extra_end_ids) {
    if (id >= 0) end_of_generation_[id] = true;
  }
  for (std::string_view text : kEndOfTurnTexts) {
    const int32_t id = find_token(text);
    if (id >= 0) end_of_generation_[id] = true;
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) ids.push_back(bos_id_);
  for (const SpecialTokenMatcher::Segment& segment : special_tokens_.split(text, parse_special)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    for (std::string_view piece : pretokenizer_.split(segment.text)) encode_piece(piece, ids);
  }
  return ids;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    if (const int32_t id = byte_token_[uint8_t(piece[0])]; id >= 0) out.push_back(id);
    return;
  }
  if (ignore_merges_) {
    const int32_t whole = find_token(byte_level::encode(piece));
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }

  // A byte without a token is left out before merging, so its neighbours may merge across it:
  // Hugging Face's BPE skips characters missing from the vocabulary the same way (no unk token).
  thread_local std::vector<int32_t> ids;  // scratch: pieces are short and many
  ids.clear();
  for (char c : piece) {
    if (const int32_t id = byte_token_[uint8_t(c)]; id >= 0) ids.push_back(id);
  }
  apply_merges(merges_, ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  KILN_CHECK(id >= 0 && id < vocab_size(), invalid_argument, "token id {} is outside the vocabulary (0..{})", id,
             vocab_size() - 1);
  return bytes_[id];
}

bool BpeTokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && id < vocab_size() && end_of_generation_[id];
}

int32_t BpeTokenizer::find_token(std::string_view text) const {
  auto it = id_of_.find(text);
  return it == id_of_.end() ? -1 : it->second;
}

}  // namespace kiln
