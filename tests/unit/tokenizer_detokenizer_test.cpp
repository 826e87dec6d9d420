#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

// Token ids 0..255 are the single bytes; 256 is "<|im_end|>".
const BpeTokenizer& byte_tokenizer() {
  static const BpeTokenizer tokenizer = [] {
    BpeVocab vocab;
    for (int b = 0; b < 256; ++b) vocab.tokens.emplace_back(byte_level::spell_byte(uint8_t(b)));
    vocab.tokens.emplace_back("<|im_end|>");
    vocab.types.assign(vocab.tokens.size(), TokenType::normal);
    vocab.types.back() = TokenType::control;
    return BpeTokenizer(std::move(vocab));
  }();
  return tokenizer;
}

std::vector<int32_t> byte_ids(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (char c : bytes) ids.push_back(uint8_t(c));
  return ids;
}

const std::string kFffd(utf8::kReplacement);

TEST(TokenizerDetokenizer, HoldsBackACharacterSplitAcrossTokens) {
  StreamingDetokenizer detok(byte_tokenizer());
  EXPECT_EQ(detok.push('a'), "a");
  EXPECT_EQ(detok.push(0xC3), "");  // é = C3 A9
  EXPECT_EQ(detok.push(0xA9), "\xC3\xA9");
  EXPECT_EQ(detok.push(0xF0), "");  // 😀 = F0 9F 98 80
  EXPECT_EQ(detok.push(0x9F), "");
  EXPECT_EQ(detok.push(0x98), "");
  EXPECT_EQ(detok.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(detok.push(256), "<|im_end|>");
  EXPECT_EQ(detok.flush(), "");
}

TEST(TokenizerDetokenizer, InvalidBytesBecomeReplacementCharacters) {
  StreamingDetokenizer detok(byte_tokenizer());
  EXPECT_EQ(detok.push(0xFF), kFffd);
  EXPECT_EQ(detok.push(0xC3), "");
  EXPECT_EQ(detok.push('x'), kFffd + "x");  // C3 can no longer complete
  EXPECT_EQ(detok.push(0xE2), "");
  EXPECT_EQ(detok.push(0x82), "");
  EXPECT_EQ(detok.flush(), kFffd);  // the stream ended inside a character
  EXPECT_EQ(detok.flush(), "");
}

TEST(TokenizerDetokenizer, StreamEqualsWholeDecodeForEverySplit) {
  // Every way of streaming the same bytes gives the same text as decoding them at once, and
  // no chunk ever ends inside a character.
  const std::string text = "h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80\xFF\xC3" "a\xED\xA0\x80!";
  const std::vector<int32_t> ids = byte_ids(text);
  const std::string whole = byte_tokenizer().decode(ids);
  EXPECT_EQ(whole, "h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80" + kFffd + kFffd + "a" + kFffd + kFffd +
                       kFffd + "!");
  StreamingDetokenizer detok(byte_tokenizer());
  std::string streamed;
  for (int32_t id : ids) {
    const std::string chunk = detok.push(id);
    EXPECT_EQ(utf8::valid_prefix_length(chunk), chunk.size());
    streamed += chunk;
  }
  streamed += detok.flush();
  EXPECT_EQ(streamed, whole);
}

TEST(TokenizerDetokenizer, DecodeOfValidTextIsExact) {
  const std::string text = "caf\xC3\xA9 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD\n\t<|im_end|>";
  EXPECT_EQ(byte_tokenizer().decode(byte_tokenizer().encode(text, false, true)), text);
  EXPECT_EQ(byte_tokenizer().decode({}), "");
}

}  // namespace
}  // namespace kiln
