// Text <-> token ids. One interface for every vocabulary kind kiln reads; built from GGUF
// metadata (tokenizer.ggml.*) or from a Hugging Face tokenizer.json.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {
namespace gguf {
class GgufFile;
}

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Builds the tokenizer a GGUF file describes: tokenizer.ggml.model "gpt2" is byte-level BPE with
  // the pre-tokenizer tokenizer.ggml.pre names; "llama" is SentencePiece BPE with scores.
  // Unsupported kinds throw kiln::Error(unsupported).
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::GgufFile& file);

  // Builds the BPE tokenizer (byte-level or SentencePiece-style) a Hugging Face tokenizer.json describes, with BOS/EOS
  // from the tokenizer_config.json beside it when present (see tokenizer/tokenizer_json.h for
  // what is supported). `extra_end_ids` (the model's EOS ids) also end generation. Throws
  // kiln::Error: unsupported naming what kiln cannot read, invalid_model for a broken file.
  static std::unique_ptr<Tokenizer> from_tokenizer_json(const std::string& path,
                                                        const std::vector<int32_t>& extra_end_ids = {});

  // Encodes text. add_bos prepends BOS when the vocabulary has one; parse_special matches
  // control/special tokens written in the text (e.g. "<|im_start|>") to their ids.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const = 0;

  // The bytes a token stands for (byte-level tokens mapped back to raw bytes; special tokens as
  // their text). May be an incomplete UTF-8 sequence: use StreamingDetokenizer to print.
  virtual std::string token_bytes(int32_t id) const = 0;
  std::string decode(const std::vector<int32_t>& ids) const;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;        // -1 when none
  virtual int32_t eos_id() const = 0;        // -1 when none
  virtual bool add_bos_default() const = 0;  // tokenizer.ggml.add_bos_token
  // End-of-generation: EOS and the other tokens that end a turn (e.g. <|im_end|>, <|eot_id|>).
  virtual bool is_end_of_generation(int32_t id) const = 0;
  // The id of a token given its exact text, or -1.
  virtual int32_t find_token(std::string_view text) const = 0;
  // SentencePiece-style vocabularies prepend a space to the text they encode; decode() takes one
  // leading space off again (Hugging Face's Strip decoder, llama.cpp's remove-space-prefix).
  virtual bool decode_strips_leading_space() const { return false; }
};

// Turns a stream of token ids into text that never ends inside a UTF-8 character: bytes of an
// incomplete character are held back until the tokens that complete it arrive. Invalid bytes
// (a sequence that can never complete) are emitted as U+FFFD.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(int32_t id);  // text that is now complete
  std::string flush();           // whatever remains, incomplete bytes as U+FFFD

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace kiln
