// BPE from a Hugging Face tokenizer.json: byte-level (GPT-2, Llama 3, Qwen2, SmolLM2) and
// SentencePiece-style (Llama 2, Mistral); see json_bpe_tokenizer.h for how each encodes.
//
// Supported: model.type "BPE" (vocab; merges as "a b" strings or [a, b] pairs; ignore_merges;
// byte_fallback; unk_token and fuse_unk; no dropout, subword prefix or word suffix), added_tokens
// (special ones matched in raw text only when parse_special, the others always; lstrip/rstrip
// absorb Unicode whitespace next to the token; single_word refused), normalizer null, NFC,
// Prepend, Replace(String) or a Sequence of them; pre_tokenizer ByteLevel (add_prefix_space
// false) alone or last in a Sequence after Split(Regex, Isolated, invert false) and Digits steps,
// or Metaspace, or null; decoder ByteLevel for byte-level files, and Replace/ByteFallback/Fuse/
// Strip or Metaspace for SentencePiece-style ones. Anything else throws kiln::Error(unsupported)
// naming what it met; a document that is not valid JSON or is inconsistent throws invalid_model.
//
// BOS/EOS come from tokenizer_config.json (bos_token / eos_token, as strings or {"content": ...};
// add_bos_token, else whether the post_processor's TemplateProcessing starts with the BOS token).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kiln {

// Builds the tokenizer from the text of tokenizer.json and (may be empty) tokenizer_config.json.
// `extra_end_ids` (e.g. generation_config.json's eos_token_id) also end generation.
std::unique_ptr<Tokenizer> tokenizer_from_json_text(std::string_view tokenizer_json,
                                                    std::string_view tokenizer_config_json,
                                                    const std::vector<int32_t>& extra_end_ids = {});

// Reads `path` (a tokenizer.json) and the tokenizer_config.json beside it, when there is one.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, const std::vector<int32_t>& extra_end_ids = {});

}  // namespace kiln
