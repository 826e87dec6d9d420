#include "tokenizer/tokenizer_json.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/safetensors/strict_json.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/merge_table.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

using nlohmann::json;

// Hugging Face ByteLevel(use_regex=True): GPT-2's regex.
constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// The same texts BpeTokenizer treats as end-of-turn when the vocabulary has them.
constexpr std::array<std::string_view, 7> kEndOfTurnTexts = {
    "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<end_of_turn>", "<|end|>",
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
  bool lstrip;
  bool rstrip;
};

struct Spec {
  std::vector<std::string> vocab;  // model.vocab spelling by id ("" for ids it lacks)
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> regexes;
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  std::vector<int32_t> end_ids;
};

// j[key], or null when j lacks it.
json member(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? json() : *it;
}

std::string type_of(const json& j) {
  if (!j.is_object()) return j.is_null() ? "null" : j.dump();
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "(no type)";
}

bool flag(const json& j, const char* key, bool fallback = false) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  KILN_CHECK(it->is_boolean(), invalid_model, "tokenizer.json: '{}' is not a boolean", key);
  return it->get<bool>();
}

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
      : pretokenizer_(spec.regexes), ignore_merges_(spec.ignore_merges), matcher_(matcher_tokens(spec.added)) {
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
      bytes_[id] = byte_level::decode(spec.vocab[id]);
    }
    for (const AddedToken& t : spec.added) {
      bytes_[t.id] = t.content;  // added tokens stand for their raw text
      added_id_[t.content] = t.id;
      lstrip_[t.id] = t.lstrip;
      rstrip_[t.id] = t.rstrip;
    }
    for (int b = 0; b < 256; ++b) byte_token_[b] = vocab_lookup(byte_level::spell_byte(uint8_t(b)));

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
      for (std::string_view p : pretokenizer_.split(piece)) encode_piece(p, ids);
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

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Map = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

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
  PreTokenizer pretokenizer_;
  bool ignore_merges_;
  SpecialTokenMatcher matcher_;
  std::vector<bool> end_of_generation_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
};

void read_model(const json& model, Spec& spec) {
  KILN_CHECK(model.is_object(), invalid_model, "tokenizer.json has no 'model' object");
  const std::string type = type_of(model);
  // Old files may omit model.type; a vocab plus merges is BPE.
  if (!(type == "BPE" || (type == "(no type)" && model.contains("merges")))) {
    KILN_FAIL(unsupported, "tokenizer.json model type '{}' is not supported; kiln reads byte-level BPE ('BPE')", type);
  }
  KILN_CHECK(!flag(model, "byte_fallback"), unsupported,
             "tokenizer.json BPE with byte_fallback true (SentencePiece-style BPE) is not supported");
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    KILN_CHECK(it->is_number() && it->get<double>() == 0.0, unsupported,
               "tokenizer.json BPE dropout {} is not supported", it->dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    KILN_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()), unsupported,
               "tokenizer.json BPE {} {} is not supported", key, it->dump());
  }
  spec.ignore_merges = flag(model, "ignore_merges");

  const json& vocab = model.at("vocab");
  KILN_CHECK(vocab.is_object(), invalid_model, "tokenizer.json model.vocab is not an object");
  KILN_CHECK(vocab.size() <= size_t(INT32_MAX), invalid_model, "tokenizer.json model.vocab is too large");
  for (const auto& [text, id_json] : vocab.items()) {
    KILN_CHECK(id_json.is_number_integer(), invalid_model, "tokenizer.json vocab entry '{}' has a non-integer id",
               text);
    const int64_t id = id_json.get<int64_t>();
    KILN_CHECK(id >= 0 && id < int64_t(vocab.size()) * 2 + 1024, invalid_model,
               "tokenizer.json vocab entry '{}' has id {} (out of range)", text, id);
    KILN_CHECK(!text.empty(), invalid_model, "tokenizer.json vocab has an empty token");
    if (size_t(id) >= spec.vocab.size()) spec.vocab.resize(size_t(id) + 1);
    KILN_CHECK(spec.vocab[id].empty(), invalid_model, "tokenizer.json vocab gives id {} to both '{}' and '{}'", id,
               spec.vocab[id], text);
    spec.vocab[id] = text;
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || merges_it->is_null()) return;
  KILN_CHECK(merges_it->is_array(), invalid_model, "tokenizer.json model.merges is not an array");
  spec.merges.reserve(merges_it->size());
  for (const json& m : *merges_it) {
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      KILN_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, invalid_model,
                 "tokenizer.json merge '{}' is not two tokens separated by one space", s);
      spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else {
      KILN_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), invalid_model,
                 "tokenizer.json merge {} is neither \"a b\" nor [a, b]", m.dump());
      spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
}

// One step of the pre-tokenizer; returns true for ByteLevel (which must come last).
bool read_pre_step(const json& step, Spec& spec) {
  const std::string type = type_of(step);
  if (type == "ByteLevel") {
    KILN_CHECK(!flag(step, "add_prefix_space"), unsupported,
               "tokenizer.json pre_tokenizer ByteLevel with add_prefix_space true is not supported");
    if (flag(step, "use_regex", true)) spec.regexes.emplace_back(kGpt2Regex);
    return true;
  }
  if (type == "Split") {
    const std::string behavior = step.contains("behavior") && step["behavior"].is_string()
                                     ? step["behavior"].get<std::string>()
                                     : "(none)";
    KILN_CHECK(behavior == "Isolated", unsupported,
               "tokenizer.json pre_tokenizer Split with behavior '{}' is not supported (only Isolated)", behavior);
    KILN_CHECK(!flag(step, "invert"), unsupported, "tokenizer.json pre_tokenizer Split with invert true is not supported");
    const json* pattern = step.contains("pattern") ? &step["pattern"] : nullptr;
    KILN_CHECK(pattern != nullptr && pattern->is_object(), invalid_model, "tokenizer.json Split has no pattern object");
    auto regex = pattern->find("Regex");
    KILN_CHECK(regex != pattern->end() && regex->is_string(), unsupported,
               "tokenizer.json pre_tokenizer Split pattern {} is not supported (only {{\"Regex\": ...}})",
               pattern->dump());
    spec.regexes.push_back(regex->get<std::string>());
    return false;
  }
  if (type == "Digits") {
    spec.regexes.emplace_back(flag(step, "individual_digits") ? "\\p{N}" : "\\p{N}+");
    return false;
  }
  KILN_FAIL(unsupported, "tokenizer.json pre_tokenizer '{}' is not supported (kiln reads ByteLevel, Split, Digits)",
            type);
}

void read_pre_tokenizer(const json& pre, Spec& spec) {
  const std::string type = type_of(pre);
  bool byte_level_last = false;
  if (type == "Sequence") {
    const json& steps = pre.at("pretokenizers");
    KILN_CHECK(steps.is_array(), invalid_model, "tokenizer.json pre_tokenizer Sequence has no pretokenizers array");
    for (size_t i = 0; i < steps.size(); ++i) {
      const bool is_byte_level = read_pre_step(steps[i], spec);
      KILN_CHECK(!is_byte_level || i + 1 == steps.size(), unsupported,
                 "tokenizer.json pre_tokenizer Sequence with ByteLevel before other steps is not supported");
      byte_level_last = is_byte_level;
    }
  } else if (pre.is_null()) {
    KILN_FAIL(unsupported, "tokenizer.json without a pre_tokenizer is not supported (kiln reads byte-level BPE)");
  } else {
    byte_level_last = read_pre_step(pre, spec);
  }
  KILN_CHECK(byte_level_last, unsupported,
             "tokenizer.json pre_tokenizer '{}' does not end in ByteLevel; kiln reads byte-level BPE only", type);
}

void read_normalizer(const json& normalizer) {
  if (normalizer.is_null()) return;
  const std::string type = type_of(normalizer);
  if (type == "Sequence" && normalizer.contains("normalizers") && normalizer["normalizers"].is_array() &&
      normalizer["normalizers"].empty())
    return;
  if (type == "NFC") {
    KILN_FAIL(unsupported,
              "tokenizer.json normalizer NFC (Unicode normalization, e.g. Qwen2) is not supported: kiln has no NFC "
              "implementation yet");
  }
  KILN_FAIL(unsupported, "tokenizer.json normalizer '{}' is not supported", type);
}

void read_decoder(const json& decoder) {
  if (decoder.is_null()) return;
  const std::string type = type_of(decoder);
  KILN_CHECK(type == "ByteLevel", unsupported, "tokenizer.json decoder '{}' is not supported (only ByteLevel)", type);
}

void read_added_tokens(const json& added, Spec& spec) {
  if (added.is_null()) return;
  KILN_CHECK(added.is_array(), invalid_model, "tokenizer.json added_tokens is not an array");
  for (const json& t : added) {
    KILN_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                   t["content"].is_string(),
               invalid_model, "tokenizer.json added token {} lacks an integer id or a string content", t.dump());
    const int64_t id = t["id"].get<int64_t>();
    const std::string content = t["content"].get<std::string>();
    KILN_CHECK(id >= 0 && id < int64_t(spec.vocab.size()) + int64_t(added.size()) + 1024, invalid_model,
               "tokenizer.json added token '{}' has id {} (out of range)", content, id);
    KILN_CHECK(!flag(t, "single_word"), unsupported,
               "tokenizer.json added token '{}' with single_word true is not supported", content);
    spec.added.push_back({content, int32_t(id), flag(t, "special"), flag(t, "lstrip"), flag(t, "rstrip")});
  }
}

// bos_token / eos_token: a string, {"content": ...}, or null.
std::optional<std::string> token_text(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  KILN_FAIL(invalid_model, "tokenizer_config.json {} is {}, not a string or {{\"content\": ...}}", key, it->dump());
}

// Whether the post-processor prepends BOS: a TemplateProcessing whose single template starts with it.
bool post_processor_adds(const json& post, const std::string& bos) {
  if (!post.is_object()) return false;
  const std::string type = type_of(post);
  if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const json& p : post["processors"]) {
      if (post_processor_adds(p, bos)) return true;
    }
    return false;
  }
  if (type != "TemplateProcessing" || !post.contains("single") || !post["single"].is_array() || post["single"].empty())
    return false;
  const json& first = post["single"][0];
  return first.is_object() && first.contains("SpecialToken") && first["SpecialToken"].is_object() &&
         first["SpecialToken"].value("id", std::string()) == bos;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_json_text(std::string_view tokenizer_json,
                                                    std::string_view tokenizer_config_json,
                                                    const std::vector<int32_t>& extra_end_ids) {
  const json doc = parse_strict_json(tokenizer_json, "tokenizer.json");
  const json config = tokenizer_config_json.empty() ? json::object()
                                                     : parse_strict_json(tokenizer_config_json, "tokenizer_config.json");
  try {
    KILN_CHECK(doc.is_object(), invalid_model, "tokenizer.json is not a JSON object");
    KILN_CHECK(config.is_object(), invalid_model, "tokenizer_config.json is not a JSON object");
    Spec spec;
    read_model(member(doc, "model"), spec);
    read_normalizer(member(doc, "normalizer"));
    read_pre_tokenizer(member(doc, "pre_tokenizer"), spec);
    read_decoder(member(doc, "decoder"));
    read_added_tokens(member(doc, "added_tokens"), spec);
    spec.end_ids = extra_end_ids;

    auto id_of = [&](const std::string& text, const char* key) -> int32_t {
      for (const AddedToken& t : spec.added) {
        if (t.content == text) return t.id;
      }
      for (size_t id = 0; id < spec.vocab.size(); ++id) {
        if (spec.vocab[id] == text) return int32_t(id);
      }
      KILN_FAIL(invalid_model, "tokenizer_config.json {} '{}' is not in the vocabulary", key, text);
    };
    const std::optional<std::string> bos = token_text(config, "bos_token");
    const std::optional<std::string> eos = token_text(config, "eos_token");
    if (bos) spec.bos_id = id_of(*bos, "bos_token");
    if (eos) spec.eos_id = id_of(*eos, "eos_token");
    if (auto it = config.find("add_bos_token"); it != config.end() && it->is_boolean()) {
      spec.add_bos = it->get<bool>();
    } else if (bos) {
      spec.add_bos = post_processor_adds(member(doc, "post_processor"), *bos);
    }
    return std::make_unique<JsonBpeTokenizer>(std::move(spec));
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL(invalid_model, "tokenizer.json is malformed: {}", e.what());
  }
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, const std::vector<int32_t>& extra_end_ids) {
  namespace fs = std::filesystem;
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    KILN_CHECK(in.good(), io, "cannot read '{}'", p.string());
    std::stringstream ss;
    ss << in.rdbuf();
    KILN_CHECK(!in.bad(), io, "error reading '{}'", p.string());
    return ss.str();
  };
  const std::string text = read(path);
  const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
  const std::string config = fs::exists(config_path) ? read(config_path) : std::string();
  return tokenizer_from_json_text(text, config, extra_end_ids);
}

}  // namespace kiln
