// libFuzzer target on the tokenizer.json reader (src/tokenizer/tokenizer_json.h): a Hugging Face
// model directory is untrusted input, and its tokenizer.json drives a vocabulary, merges, added
// tokens, normalizers and pre-tokenizer regexes. Any input must either build a tokenizer or throw
// kiln::Error; a built one then encodes and decodes a fixed text (with and without special-token
// parsing) and prints its first tokens, which must not crash either.
// Seeds: the reduced tokenizers of tests/data/tokenizer_json (scripts/fuzz.sh passes them).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string_view config =
      R"({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": true})";
  static const std::string text =
      "Hello, world! <|im_start|>user\n  caf\xc3\xa9 1234567 \xf0\x9f\x99\x82\tend<|im_end|>\xff\xfe";
  std::unique_ptr<kiln::Tokenizer> tok;
  try {
    tok = kiln::tokenizer_from_json_text(std::string_view(reinterpret_cast<const char*>(data), size), config);
  } catch (const kiln::Error&) {
    return 0;
  }
  for (const bool parse_special : {false, true}) {
    const std::vector<int32_t> ids = tok->encode(text, true, parse_special);
    for (int32_t id : ids)
      if (id < 0 || id >= tok->vocab_size()) __builtin_trap();  // encode must give ids of the vocabulary
    (void)tok->decode(ids);
    kiln::StreamingDetokenizer stream(*tok);
    for (int32_t id : ids) (void)stream.push(id);
    (void)stream.flush();
  }
  for (int32_t id = 0; id < std::min<int32_t>(tok->vocab_size(), 64); ++id) (void)tok->token_bytes(id);
  (void)tok->find_token("<|im_end|>");
  return 0;
}
