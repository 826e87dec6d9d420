// The tokenizer a Hugging Face tokenizer.json describes, once read (tokenizer_json.cpp reads and
// validates the file into a TokenizerJsonSpec). Two forms of BPE:
//
//   byte-level (GPT-2, Llama 3, Qwen2, SmolLM2): optional NFC, regex pre-tokenizers ending in
//     ByteLevel, merges over GPT-2's byte alphabet;
//   SentencePiece-style (Llama 2, Mistral): spaces spelled "▁" by the normalizer (legacy:
//     Prepend + Replace) or by a Metaspace pre-tokenizer, merges over UTF-8 characters, byte
//     fallback to "<0xXX>" tokens, the decoder turning "▁" back into spaces.
//
// Added tokens are cut out of the raw text first and the normalizer runs on each piece between
// them, as Hugging Face's AddedVocabulary does (hence legacy Llama 2 files put a "▁" after every
// special token).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct TokenizerJsonSpec {
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special;
    bool lstrip;
    bool rstrip;
  };
  struct Metaspace {
    bool enabled = false;
    std::string replacement = "\xE2\x96\x81";
    enum Prepend { always, first, never } prepend = always;
    bool split = true;
  };

  std::vector<std::string> vocab;  // model.vocab spelling by id ("" for ids it lacks)
  std::vector<std::pair<std::string, std::string>> merges;
  bool ignore_merges = false;
  bool byte_fallback = false;
  std::string unk_token;  // "" when none
  bool fuse_unk = false;

  Normalizer normalizer;
  bool byte_level = true;            // pre-tokenizer ends in ByteLevel
  std::vector<std::string> regexes;  // byte-level: Split/Digits/ByteLevel regexes in order
  Metaspace metaspace;               // SentencePiece-style

  // Decoder of the SentencePiece-style form: this text becomes a space; "<0xXX>" tokens become
  // their byte (ByteFallback); one leading space is stripped from decoded text (Strip / Metaspace).
  std::string decode_space_mark;
  bool decode_byte_fallback = false;
  bool decode_strip_leading_space = false;

  std::vector<AddedToken> added;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
  std::vector<int32_t> end_ids;
};

// Throws kiln::Error(invalid_model) when the spec is inconsistent (a merge naming a missing
// token, ids out of range).
std::unique_ptr<Tokenizer> make_json_bpe_tokenizer(TokenizerJsonSpec spec);

}  // namespace kiln
