#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "tokenizer/pretokenizer.h"

namespace kiln {
namespace {

std::vector<std::string> split(std::string_view pre, std::string_view text) {
  PreTokenizer pretokenizer(pretokenizer_config(pre).regexes);
  std::vector<std::string> out;
  for (std::string_view piece : pretokenizer.split(text)) out.emplace_back(piece);
  return out;
}

using Pieces = std::vector<std::string>;

// Expected pieces recorded from Hugging Face tokenizers: a Sequence of Split(Regex, "isolated")
// with the same regexes in their tokenizer.json spelling.
TEST(TokenizerPreTokenizer, SmolLMCutsDigitsApartFirst) {
  EXPECT_EQ(split("smollm", "I'm 12345 years"), (Pieces{"I", "'m", " ", "1", "2", "3", "4", "5", " years"}));
  EXPECT_EQ(split("smollm", "x = 1234;\n\n\ty"), (Pieces{"x", " =", " ", "1", "2", "3", "4", ";", "\n\n", "\t", "y"}));
  EXPECT_EQ(split("smollm", "3.14 \xC2\xB2\xD9\xA1"), (Pieces{"3", ".", "1", "4", " ", "\xC2\xB2", "\xD9\xA1"}));
}

TEST(TokenizerPreTokenizer, Gpt2) {
  EXPECT_EQ(split("gpt2", "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split("gpt2", "I'm 12345 years"), (Pieces{"I", "'m", " 12345", " years"}));
  // `\s+(?!\S)` leaves the last space of a run to the word after it.
  EXPECT_EQ(split("gpt2", "a  b\n\n  c  "), (Pieces{"a", " ", " b", "\n\n ", " c", "  "}));
  EXPECT_EQ(split("gpt2", "DON'T you'LL"), (Pieces{"DON", "'", "T", " you", "'", "LL"}));
  EXPECT_EQ(split("gpt2", "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD!!"), (Pieces{"caf\xC3\xA9", " \xE4\xBD\xA0\xE5\xA5\xBD", "!!"}));
  EXPECT_EQ(split("gpt2", "3.14 \xC2\xB2\xD9\xA1"), (Pieces{"3", ".", "14", " \xC2\xB2\xD9\xA1"}));
  EXPECT_EQ(split("gpt2", "  \t\n"), (Pieces{"  \t\n"}));
  EXPECT_EQ(split("gpt2", "end   "), (Pieces{"end", "   "}));
}

TEST(TokenizerPreTokenizer, Llama3) {
  EXPECT_EQ(split("llama-bpe", "I'm 12345 years"), (Pieces{"I", "'m", " ", "123", "45", " years"}));
  EXPECT_EQ(split("llama-bpe", "a  b\n\n  c  "), (Pieces{"a", " ", " b", "\n\n", " ", " c", "  "}));
  EXPECT_EQ(split("llama-bpe", "x = 1234;\n\n\ty"), (Pieces{"x", " =", " ", "123", "4", ";\n\n", "\ty"}));
  EXPECT_EQ(split("llama-bpe", "DON'T you'LL"), (Pieces{"DON", "'T", " you", "'LL"}));
  EXPECT_EQ(split("llama-bpe", "3.14 \xC2\xB2\xD9\xA1"), (Pieces{"3", ".", "14", " ", "\xC2\xB2\xD9\xA1"}));
  EXPECT_TRUE(pretokenizer_config("llama-bpe").ignore_merges);
  EXPECT_FALSE(pretokenizer_config("smollm").ignore_merges);
}

TEST(TokenizerPreTokenizer, Qwen2) {
  EXPECT_EQ(split("qwen2", "I'm 12345 years"), (Pieces{"I", "'m", " ", "1", "2", "3", "4", "5", " years"}));
  EXPECT_EQ(split("qwen2", "x = 1234;\n\n\ty"), (Pieces{"x", " =", " ", "1", "2", "3", "4", ";\n\n", "\ty"}));
  EXPECT_EQ(split("qwen2", "DON'T you'LL"), (Pieces{"DON", "'T", " you", "'LL"}));
}

TEST(TokenizerPreTokenizer, UnknownNameIsUnsupportedAndNamed) {
  try {
    pretokenizer_config("no-such-pre");
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("no-such-pre"), std::string::npos) << e.what();
  }
}

TEST(TokenizerPreTokenizer, BadRegexIsReported) {
  EXPECT_THROW(PreTokenizer({"(unclosed"}), Error);
}

TEST(TokenizerPreTokenizer, EmptyMatchesDoNotLoop) {
  PreTokenizer pretokenizer({"x*"});
  std::vector<std::string_view> pieces = pretokenizer.split("abxxc");
  EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()), (Pieces{"ab", "xx", "c"}));
}

TEST(TokenizerPreTokenizer, InvalidUtf8BecomesSingleBytePieces) {
  EXPECT_EQ(split("gpt2", "ab\xFF" "cd\xC3"), (Pieces{"ab", "\xFF", "cd", "\xC3"}));
  EXPECT_EQ(split("smollm", "\xE2\x82" "1"), (Pieces{"\xE2", "\x82", "1"}));
}

TEST(TokenizerPreTokenizer, PiecesCoverRandomBytesExactly) {
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "Z", " ", "  ", "\n", "\r\n", "\t", "7", "'s", "'", "!", ".",
                                             "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80", "\xFF", "\xC3", "\xA0"};
  for (std::string_view pre : {"gpt2", "smollm", "llama-bpe", "qwen2"}) {
    PreTokenizer pretokenizer(pretokenizer_config(pre).regexes);
    for (int round = 0; round < 200; ++round) {
      std::string text;
      const int n = int(rng() % 30);
      for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
      std::string joined;
      for (std::string_view piece : pretokenizer.split(text)) {
        EXPECT_FALSE(piece.empty());
        joined += piece;
      }
      EXPECT_EQ(joined, text) << pre;
    }
  }
}

TEST(TokenizerPreTokenizer, LongRunsDoNotExhaustTheMatcher) {
  // One megabyte of a single class: backtracking over `\s+(?!\S)` and `\p{L}+` must stay bounded.
  for (std::string_view pre : {"gpt2", "smollm", "llama-bpe", "qwen2"}) {
    PreTokenizer pretokenizer(pretokenizer_config(pre).regexes);
    for (char c : {' ', 'a', '\n', '!'}) {
      const std::string text(1 << 20, c);
      size_t total = 0;
      for (std::string_view piece : pretokenizer.split(text + "x")) total += piece.size();
      EXPECT_EQ(total, text.size() + 1) << pre << " on a run of " << int(c);
    }
  }
}

}  // namespace
}  // namespace kiln
