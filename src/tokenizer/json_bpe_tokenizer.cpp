#include "tokenizer/json_bpe_tokenizer.h"

#include <array>

#include "core/check.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/char_symbols.h"
#include "tokenizer/merge_table.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/token_map.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

using Spec = TokenizerJsonSpec;
using AddedToken = TokenizerJsonSpec::AddedToken;

// Whitespace as Rust's char::is_whitespace (what Hugging Face's lstrip/rstrip absorb).
bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

uint32_t decode_at(std::string_view s, size_t pos, size_t len) {
  const auto b = [&](size_t i) { return uint32_t(uint8_t(s[pos + i])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

std::string_view strip_leading_whitespace(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const utf8::Scan sc = utf8::scan(s.substr(pos));
    if (sc.kind != utf8::Scan::valid || !is_whitespace(decode_at(s, pos, sc.length))) break;
    pos += sc.length;
  }
  return s.substr(pos);
}

std::string_view strip_trailing_whitespace(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    const utf8::Scan sc = utf8::scan(s.substr(start, end - start));
    if (sc.kind != utf8::Scan::valid || sc.length != end - start || !is_whitespace(decode_at(s, start, sc.length)))
      break;
    end = start;
  }
  return s.substr(0, end);
}

class JsonBpeTokenizer final : public Tokenizer {
 public:
  explicit JsonBpeTokenizer(Spec spec)
      : pretokenizer_(spec.regexes),
        ignore_merges_(spec.ignore_merges),
        byte_level_(spec.byte_level),
        normalizer_(spec.normalizer),
        metaspace_(spec.metaspace),
        strip_leading_space_(spec.decode_strip_leading_space),
        matcher_(matcher_tokens(spec.added)) {
    size_t n = spec.vocab.size();
    for (const AddedToken& t : spec.added) n = std::max(n, size_t(t.id) + 1);
    KILN_CHECK(n > 0, invalid_model, "tokenizer.json: the vocabulary is empty");
    bytes_.resize(n);
    lstrip_.assign(n, false);
    rstrip_.assign(n, false);
    vocab_id_.reserve(spec.vocab.size());
    for (size_t id = 0; id < spec.vocab.size(); ++id) {
      if (spec.vocab[id].empty()) continue;
      vocab_id_[spec.vocab[id]] = int32_t(id);
      bytes_[id] = decoded_spelling(spec, spec.vocab[id]);
    }
    for (const AddedToken& t : spec.added) {
      bytes_[t.id] = t.content;  // added tokens stand for their raw text
      added_id_[t.content] = t.id;
      lstrip_[t.id] = t.lstrip;
      rstrip_[t.id] = t.rstrip;
    }
    for (int b = 0; b < 256; ++b) byte_token_[b] = spec.byte_level ? vocab_lookup(byte_level::spell_byte(uint8_t(b))) : -1;
    symbols_.tokens = &vocab_id_;
    symbols_.byte_tokens.fill(-1);
    if (spec.byte_fallback) symbols_.byte_tokens = CharSymbolVocab::find_byte_tokens(vocab_id_);
    if (!spec.unk_token.empty()) {
      symbols_.unk_id = vocab_lookup(spec.unk_token);
      KILN_CHECK(symbols_.unk_id >= 0, invalid_model, "tokenizer.json unk_token '{}' is not in the vocabulary",
                 spec.unk_token);
    }
    symbols_.fuse_unk = spec.fuse_unk;

    merges_ = MergeTable(spec.merges.size());
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const auto& [left, right] = spec.merges[rank];
      const int32_t left_id = vocab_lookup(left), right_id = vocab_lookup(right);
      const int32_t result = vocab_lookup(left + right);
      KILN_CHECK(left_id >= 0 && right_id >= 0 && result >= 0, invalid_model,
                 "tokenizer.json: merge {} ('{}' '{}') names a token the vocabulary lacks", rank, left, right);
      merges_.insert(left_id, right_id, {int32_t(rank), result});
    }

    auto check_id = [&](int32_t id, std::string_view what) {
      KILN_CHECK(id >= -1 && id < int64_t(n), invalid_model, "the {} token id {} is outside the vocabulary (0..{})",
                 what, id, n - 1);
    };
    check_id(spec.bos_id, "BOS");
    check_id(spec.eos_id, "EOS");
    bos_id_ = spec.bos_id;
    eos_id_ = spec.eos_id;
    add_bos_ = spec.add_bos && bos_id_ >= 0;
    end_of_generation_.assign(n, false);
    if (eos_id_ >= 0) end_of_generation_[eos_id_] = true;
    for (int32_t id : spec.end_ids) {
      // An id the tokenizer lacks (a model padding its embedding) cannot come out of decode anyway.
      if (id >= 0 && size_t(id) < n) end_of_generation_[id] = true;
    }
    if (eos_id_ < 0) {
      for (int32_t id : spec.end_ids) {
        if (id >= 0 && size_t(id) < n) {
          eos_id_ = id;
          break;
        }
      }
    }
    for (std::string_view text : kEndOfTurnTexts) {
      if (const int32_t id = find_token(text); id >= 0) end_of_generation_[id] = true;
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 2);
    if (add_bos && bos_id_ >= 0) ids.push_back(bos_id_);
    const std::vector<SpecialTokenMatcher::Segment> segments = matcher_.split(text, parse_special);
    for (size_t i = 0; i < segments.size(); ++i) {
      const SpecialTokenMatcher::Segment& segment = segments[i];
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      std::string_view piece = segment.text;
      // lstrip/rstrip: the token's match takes in the whitespace beside it.
      if (i + 1 < segments.size() && segments[i + 1].id >= 0 && lstrip_[segments[i + 1].id])
        piece = strip_trailing_whitespace(piece);
      if (i > 0 && segments[i - 1].id >= 0 && rstrip_[segments[i - 1].id]) piece = strip_leading_whitespace(piece);
      if (piece.empty()) continue;
      const std::string normalized = normalizer_.empty() ? std::string() : normalizer_.apply(piece);
      if (!normalizer_.empty()) piece = normalized;
      if (byte_level_) {
        for (std::string_view p : pretokenizer_.split(piece)) encode_piece(p, ids);
      } else {
        const bool at_start = segment.text.data() == text.data() && piece.data() == segment.text.data();
        encode_sentencepiece(piece, at_start, ids);
      }
    }
    return ids;
  }

  std::string token_bytes(int32_t id) const override {
    KILN_CHECK(id >= 0 && id < vocab_size(), invalid_argument, "token id {} is outside the vocabulary (0..{})", id,
               vocab_size() - 1);
    return bytes_[id];
  }
  int32_t vocab_size() const override { return int32_t(bytes_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool add_bos_default() const override { return add_bos_; }
  bool is_end_of_generation(int32_t id) const override {
    return id >= 0 && id < vocab_size() && end_of_generation_[id];
  }
  int32_t find_token(std::string_view text) const override {
    if (auto it = added_id_.find(text); it != added_id_.end()) return it->second;
    return vocab_lookup(text);
  }
  bool decode_strips_leading_space() const override { return strip_leading_space_; }

 private:
  using Map = TokenIdMap;

  // What a model.vocab token decodes to.
  static std::string decoded_spelling(const Spec& spec, const std::string& text) {
    if (spec.byte_level) return byte_level::decode(text);
    uint8_t byte = 0;
    if (spec.decode_byte_fallback && parse_byte_token(text, byte)) return std::string(1, char(byte));
    return spec.decode_space_mark.empty() ? text : replace_all(text, spec.decode_space_mark, " ");
  }

  // SentencePiece-style: the Metaspace pre-tokenizer (when present), then merges over characters.
  // `at_start`: the piece begins the input (Metaspace prepend_scheme "first").
  void encode_sentencepiece(std::string_view piece, bool at_start, std::vector<int32_t>& out) const {
    if (!metaspace_.enabled) {
      encode_chars(piece, out);
      return;
    }
    const std::string& mark = metaspace_.replacement;
    std::string spelled = replace_all(piece, " ", mark);
    const bool prepend = metaspace_.prepend == Spec::Metaspace::always ||
                         (metaspace_.prepend == Spec::Metaspace::first && at_start);
    if (prepend && spelled.compare(0, mark.size(), mark) != 0) spelled.insert(0, mark);
    if (!metaspace_.split) {
      encode_chars(spelled, out);
      return;
    }
    // Split before each mark, the mark starting the next piece (MergedWithNext).
    const std::string_view s = spelled;
    size_t start = 0;
    for (size_t hit = s.find(mark, 1); hit != std::string_view::npos; hit = s.find(mark, hit + mark.size())) {
      if (hit > start) encode_chars(s.substr(start, hit - start), out);
      start = hit;
    }
    if (start < s.size()) encode_chars(s.substr(start), out);
  }

  void encode_chars(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (const int32_t whole = vocab_lookup(word); whole >= 0) {
        out.push_back(whole);
        return;
      }
    }
    thread_local std::vector<int32_t> ids;
    ids.clear();
    append_char_symbols(symbols_, word, ids);
    apply_merges(merges_, ids);
    out.insert(out.end(), ids.begin(), ids.end());
  }

  static std::vector<SpecialTokenMatcher::Token> matcher_tokens(const std::vector<AddedToken>& added) {
    std::vector<SpecialTokenMatcher::Token> out;
    for (const AddedToken& t : added) out.push_back({t.content, t.id, t.special});
    return out;
  }

  int32_t vocab_lookup(std::string_view text) const {
    auto it = vocab_id_.find(text);
    return it == vocab_id_.end() ? -1 : it->second;
  }

  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
      if (const int32_t id = byte_token_[uint8_t(piece[0])]; id >= 0) out.push_back(id);
      return;
    }
    if (ignore_merges_) {
      if (const int32_t whole = vocab_lookup(byte_level::encode(piece)); whole >= 0) {
        out.push_back(whole);
        return;
      }
    }
    thread_local std::vector<int32_t> ids;
    ids.clear();
    for (char c : piece) {
      if (const int32_t id = byte_token_[uint8_t(c)]; id >= 0) ids.push_back(id);
    }
    apply_merges(merges_, ids);
    out.insert(out.end(), ids.begin(), ids.end());
  }

  Map vocab_id_;
  Map added_id_;
  std::vector<std::string> bytes_;
  std::vector<bool> lstrip_, rstrip_;
  MergeTable merges_;
  int32_t byte_token_[256];
  CharSymbolVocab symbols_;
  PreTokenizer pretokenizer_;
  bool ignore_merges_;
  bool byte_level_;
  Normalizer normalizer_;
  Spec::Metaspace metaspace_;
  bool strip_leading_space_;
  SpecialTokenMatcher matcher_;
  std::vector<bool> end_of_generation_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> make_json_bpe_tokenizer(TokenizerJsonSpec spec) {
  return std::make_unique<JsonBpeTokenizer>(std::move(spec));
}

}  // namespace kiln
