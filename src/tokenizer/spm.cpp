#include "tokenizer/spm.h"

#include <algorithm>
#include <array>

#include "core/check.h"
#include "tokenizer/token_map.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

TokenType type_of(const SpmVocab& vocab, size_t id) {
  return vocab.types.empty() ? TokenType::normal : vocab.types[id];
}

const SpmVocab& validated(const SpmVocab& vocab) {
  const size_t n = vocab.tokens.size();
  KILN_CHECK(n > 0 && n <= size_t(INT32_MAX), invalid_model, "the tokenizer vocabulary has {} tokens", n);
  KILN_CHECK(vocab.scores.size() == n, invalid_model, "tokenizer.ggml.scores has {} entries for {} tokens",
             vocab.scores.size(), n);
  KILN_CHECK(vocab.types.empty() || vocab.types.size() == n, invalid_model,
             "tokenizer.ggml.token_type has {} entries for {} tokens", vocab.types.size(), n);
  for (int32_t id : {vocab.bos_id, vocab.eos_id, vocab.unk_id}) {
    KILN_CHECK(id >= -1 && id < int64_t(n), invalid_model, "a special token id {} is outside the vocabulary (0..{})",
               id, n - 1);
  }
  return vocab;
}

std::vector<SpecialTokenMatcher::Token> added_tokens(const SpmVocab& vocab) {
  std::vector<SpecialTokenMatcher::Token> out;
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    const TokenType type = type_of(vocab, id);
    if (type == TokenType::control || type == TokenType::user_defined)
      out.push_back({vocab.tokens[id], int32_t(id), type == TokenType::control});
  }
  return out;
}

// Rank of each token's score: 0 for the highest, equal scores equal ranks.
std::vector<int32_t> score_ranks(const std::vector<float>& scores) {
  std::vector<float> distinct = scores;
  std::sort(distinct.begin(), distinct.end(), std::greater<>());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<int32_t> ranks(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    ranks[i] = int32_t(std::lower_bound(distinct.begin(), distinct.end(), scores[i], std::greater<>()) -
                       distinct.begin());
  }
  return ranks;
}

}  // namespace

SpmTokenizer::SpmTokenizer(SpmVocab vocab)
    : special_tokens_(added_tokens(validated(vocab))),
      bos_id_(vocab.bos_id),
      eos_id_(vocab.eos_id),
      add_bos_(vocab.add_bos && vocab.bos_id >= 0),
      add_space_prefix_(vocab.add_space_prefix) {
  const size_t n = vocab.tokens.size();
  bytes_.resize(n);
  id_of_.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = vocab.tokens[id];
    id_of_[text] = int32_t(id);  // a later duplicate wins, as in llama.cpp
    uint8_t byte = 0;
    switch (type_of(vocab, id)) {
      case TokenType::byte:
        KILN_CHECK(parse_byte_token(text, byte), invalid_model, "byte token {} is '{}', not <0xXX>", id, text);
        bytes_[id] = std::string(1, char(byte));
        break;
      case TokenType::control:
        bytes_[id] = text;
        break;
      case TokenType::unknown:
        bytes_[id] = " \xE2\x81\x87 ";  // llama.cpp prints the unknown token as " ⁇ "
        break;
      default:
        bytes_[id] = replace_all(text, kSpaceMark, " ");
    }
  }

  symbols_.tokens = &id_of_;
  symbols_.byte_tokens = CharSymbolVocab::find_byte_tokens(id_of_);
  symbols_.unk_id = vocab.unk_id;

  // Merge rules from the scores: each split of a token's text at a character boundary into two
  // tokens. Bytes are tokens too ("<0x41>"), but their text never arises from merging characters
  // other than its own six, so they need no special case.
  const std::vector<int32_t> ranks = score_ranks(vocab.scores);
  merges_ = MergeTable(n * 4);
  for (size_t id = 0; id < n; ++id) {
    const std::string_view text = vocab.tokens[id];
    if (text.empty() || lookup(id_of_, text) != int32_t(id)) continue;  // a duplicate's earlier copy
    auto char_length = [&](size_t at) {
      const utf8::Scan sc = utf8::scan(text.substr(at));
      return sc.kind == utf8::Scan::valid ? sc.length : 1;
    };
    for (size_t cut = char_length(0); cut < text.size(); cut += char_length(cut)) {
      const int32_t left = lookup(id_of_, text.substr(0, cut));
      const int32_t right = lookup(id_of_, text.substr(cut));
      if (left >= 0 && right >= 0) merges_.insert(left, right, {ranks[id], int32_t(id)});
    }
  }

  end_of_generation_.assign(n, false);
  if (eos_id_ >= 0) end_of_generation_[eos_id_] = true;
  for (int32_t id : vocab.extra_end_ids) {
    KILN_CHECK(id >= 0 && id < int64_t(n), invalid_model, "end-of-turn token id {} is outside the vocabulary", id);
    end_of_generation_[id] = true;
  }
  for (std::string_view text : kEndOfTurnTexts) {
    if (const int32_t id = find_token(text); id >= 0) end_of_generation_[id] = true;
  }
}

void SpmTokenizer::encode_text(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const {
  std::string escaped;
  if (space_prefix) escaped = kSpaceMark;
  escaped += replace_all(text, " ", kSpaceMark);
  thread_local std::vector<int32_t> ids;
  ids.clear();
  append_char_symbols(symbols_, escaped, ids);
  apply_merges(merges_, ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) ids.push_back(bos_id_);
  // llama.cpp adds the space prefix at the start and after every special token.
  bool after_special = true;
  for (const SpecialTokenMatcher::Segment& segment : special_tokens_.split(text, parse_special)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      after_special = true;
    } else {
      encode_text(segment.text, add_space_prefix_ && after_special, ids);
      after_special = false;
    }
  }
  return ids;
}

std::string SpmTokenizer::token_bytes(int32_t id) const {
  KILN_CHECK(id >= 0 && id < vocab_size(), invalid_argument, "token id {} is outside the vocabulary (0..{})", id,
             vocab_size() - 1);
  return bytes_[id];
}

bool SpmTokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && id < vocab_size() && end_of_generation_[id];
}

}  // namespace kiln
