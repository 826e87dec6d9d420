#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

TEST(TokenizerByteLevel, MapIsABijectionOntoPrintableCodePoints) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_level::byte_to_code_point(uint8_t(b));
    EXPECT_TRUE(seen.insert(cp).second) << "code point " << cp << " used twice";
    EXPECT_EQ(byte_level::code_point_to_byte(cp), b);
    EXPECT_GT(cp, 0x20u) << "byte " << b << " is spelled with a control character or space";
    EXPECT_LE(cp, 0x143u);
  }
  EXPECT_EQ(byte_level::code_point_to_byte(0x144), -1);
  EXPECT_EQ(byte_level::code_point_to_byte(0x20), -1);
}

TEST(TokenizerByteLevel, KnownSpellings) {
  EXPECT_EQ(byte_level::spell_byte(' '), "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(byte_level::spell_byte('\n'), "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(byte_level::spell_byte('\t'), "\xC4\x89");  // ĉ U+0109
  EXPECT_EQ(byte_level::spell_byte('A'), "A");
  EXPECT_EQ(byte_level::spell_byte(0xE9), "\xC3\xA9");  // é stands for itself
  EXPECT_EQ(byte_level::spell_byte(0xAD), "\xC5\x83");  // soft hyphen is the last extra: U+0143
  EXPECT_EQ(byte_level::encode("a b\n"), "a\xC4\xA0" "b\xC4\x8A");
}

TEST(TokenizerByteLevel, EveryByteStringRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  EXPECT_EQ(byte_level::decode(byte_level::encode(all)), all);
  EXPECT_EQ(byte_level::decode(byte_level::encode("h\xC3\xA9llo \xF0\x9F\x98\x80\n")), "h\xC3\xA9llo \xF0\x9F\x98\x80\n");
  std::string two_byte_pairs;
  for (int a = 0; a < 256; a += 7) {
    for (int b = 0; b < 256; b += 5) two_byte_pairs += {char(a), char(b)};
  }
  EXPECT_EQ(byte_level::decode(byte_level::encode(two_byte_pairs)), two_byte_pairs);
}

TEST(TokenizerByteLevel, DecodeKeepsCharactersOutsideTheAlphabet) {
  // Added tokens are stored as raw text: their characters must pass through.
  EXPECT_EQ(byte_level::decode("<|im_end|>"), "<|im_end|>");
  EXPECT_EQ(byte_level::decode("\xE4\xBD\xA0"), "\xE4\xBD\xA0");  // 你
  EXPECT_EQ(byte_level::decode(" \n"), " \n");
  EXPECT_EQ(byte_level::decode("\xFF"), "\xFF");
}

TEST(TokenizerUtf8, ValidPrefixLength) {
  EXPECT_EQ(utf8::valid_prefix_length(""), 0u);
  EXPECT_EQ(utf8::valid_prefix_length("abc"), 3u);
  EXPECT_EQ(utf8::valid_prefix_length("a\xC3\xA9" "b"), 4u);
  EXPECT_EQ(utf8::valid_prefix_length("a\xC3"), 1u);
  EXPECT_EQ(utf8::valid_prefix_length("ab\xED\xA0\x80"), 2u);        // a surrogate
  EXPECT_EQ(utf8::valid_prefix_length("\xC0\x80"), 0u);              // overlong NUL
  EXPECT_EQ(utf8::valid_prefix_length("\xF4\x90\x80\x80"), 0u);      // above U+10FFFF
  EXPECT_EQ(utf8::valid_prefix_length("\xF0\x9F\x98\x80x"), 5u);
}

std::string replaced(std::string_view bytes) {
  std::string out;
  utf8::append_replacing_invalid(out, bytes, true);
  return out;
}

TEST(TokenizerUtf8, ReplacementCountsMaximalSubparts) {
  const std::string fffd(utf8::kReplacement);
  // The expectations are Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(replaced("\xFF"), fffd);
  EXPECT_EQ(replaced("a\xC3" "b"), "a" + fffd + "b");
  EXPECT_EQ(replaced("\xE0\x80\x80"), fffd + fffd + fffd);
  EXPECT_EQ(replaced("\xED\xA0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(replaced("\xF0\x9F\x98" "a"), fffd + "a");
  EXPECT_EQ(replaced("\xF0\x9F\x98"), fffd);
  EXPECT_EQ(replaced("\xE2\x82\xAC\x80"), "\xE2\x82\xAC" + fffd);
}

TEST(TokenizerUtf8, NotFinalHoldsBackAnIncompleteTail) {
  std::string out;
  EXPECT_EQ(utf8::append_replacing_invalid(out, "ab\xF0\x9F", false), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(utf8::append_replacing_invalid(out, "\xF0\x9F" "a", false), 3u);  // can no longer complete
  EXPECT_EQ(out, std::string(utf8::kReplacement) + "a");
}

}  // namespace
}  // namespace kiln
