// Tokenizer::from_gguf: reads tokenizer.ggml.* and builds the tokenizer the file describes.
#include "tokenizer/tokenizer.h"

#include <cmath>

#include "core/check.h"
#include "model/gguf/gguf_file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"
#include "tokenizer/tokenizer_json.h"

namespace kiln {
namespace {

std::vector<TokenType> read_token_types(const gguf::GgufFile& file, size_t n_tokens) {
  const std::vector<double>* types = file.get_number_array("tokenizer.ggml.token_type");
  if (types == nullptr) return {};
  KILN_CHECK(types->size() == n_tokens, invalid_model, "tokenizer.ggml.token_type has {} entries for {} tokens",
             types->size(), n_tokens);
  std::vector<TokenType> out;
  out.reserve(n_tokens);
  for (double t : *types) {
    // Unknown values are read as undefined, as llama.cpp does: a newer converter may add kinds.
    const bool known = t >= 0 && t <= 6 && std::floor(t) == t;
    out.push_back(known ? TokenType(int32_t(t)) : TokenType::undefined);
  }
  return out;
}

int32_t read_token_id(const gguf::GgufFile& file, std::string_view key, size_t n_tokens) {
  const std::optional<int64_t> id = file.get_int(key);
  if (!id) return -1;
  KILN_CHECK(*id >= 0 && *id < int64_t(n_tokens), invalid_model, "{} is {}, outside the vocabulary (0..{})", key, *id,
             n_tokens - 1);
  return int32_t(*id);
}

// What every GGUF vocabulary has, whatever its model: tokens, their types, BOS/EOS and the other
// end-of-turn ids. Vocab is BpeVocab or SpmVocab (same field names).
template <typename Vocab>
void read_common_vocab(const gguf::GgufFile& file, Vocab& vocab) {
  const std::vector<std::string>* tokens = file.get_string_array("tokenizer.ggml.tokens");
  KILN_CHECK(tokens != nullptr && !tokens->empty(), invalid_model,
             "the GGUF has no vocabulary (tokenizer.ggml.tokens is missing or empty)");
  vocab.tokens = *tokens;
  const size_t n = vocab.tokens.size();
  vocab.types = read_token_types(file, n);
  vocab.bos_id = read_token_id(file, "tokenizer.ggml.bos_token_id", n);
  vocab.eos_id = read_token_id(file, "tokenizer.ggml.eos_token_id", n);
  for (std::string_view key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int32_t id = read_token_id(file, key, n);
    if (id >= 0) vocab.extra_end_ids.push_back(id);
  }
}

std::unique_ptr<Tokenizer> bpe_from_gguf(const gguf::GgufFile& file) {
  BpeVocab vocab;
  read_common_vocab(file, vocab);
  if (const std::vector<std::string>* merges = file.get_string_array("tokenizer.ggml.merges")) vocab.merges = *merges;
  // A missing pre-tokenizer means an old converter; llama.cpp falls back to "default" too.
  vocab.pre = file.get_string("tokenizer.ggml.pre").value_or("default");
  vocab.add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
  return std::make_unique<BpeTokenizer>(std::move(vocab));
}

std::unique_ptr<Tokenizer> spm_from_gguf(const gguf::GgufFile& file) {
  SpmVocab vocab;
  read_common_vocab(file, vocab);
  const size_t n = vocab.tokens.size();
  const std::vector<double>* scores = file.get_number_array("tokenizer.ggml.scores");
  KILN_CHECK(scores != nullptr, invalid_model, "a SentencePiece vocabulary needs tokenizer.ggml.scores; the GGUF has none");
  vocab.scores.assign(scores->begin(), scores->end());
  vocab.unk_id = read_token_id(file, "tokenizer.ggml.unknown_token_id", n);
  // llama.cpp's defaults for SentencePiece vocabularies: BOS yes, space prefix yes.
  vocab.add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
  vocab.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  return std::make_unique<SpmTokenizer>(std::move(vocab));
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  const std::optional<std::string> model = file.get_string("tokenizer.ggml.model");
  KILN_CHECK(model.has_value(), invalid_model, "the GGUF has no tokenizer (tokenizer.ggml.model is missing)");
  if (*model == "gpt2") return bpe_from_gguf(file);
  if (*model == "llama") return spm_from_gguf(file);
  KILN_FAIL(unsupported,
            "tokenizer.ggml.model '{}' is not supported; kiln reads byte-level BPE ('gpt2') and SentencePiece BPE "
            "('llama')",
            *model);
}

std::unique_ptr<Tokenizer> Tokenizer::from_tokenizer_json(const std::string& path,
                                                          const std::vector<int32_t>& extra_end_ids) {
  return load_tokenizer_json(path, extra_end_ids);
}

}  // namespace kiln
