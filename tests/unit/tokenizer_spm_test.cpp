// SentencePiece BPE from GGUF (tokenizer.ggml.model = "llama"): parity with llama.cpp on the
// 2,000 shared strings (vocabulary trained with `sentencepiece`, ids from llama-cpp-python; see
// python/make_spm_gguf_fixture.py), and the rules on small hand-made vocabularies.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "expect_error.h"
#include "gguf_builder.h"
#include "model/gguf/gguf_file.h"
#include "tokenizer/spm.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST(TokenizerSpm, MatchesLlamaCppOnTwoThousandStrings) {
  const fs::path dir = fs::path(KILN_TEST_DATA) / "tokenizer_json";
  const gguf::GgufFile file = gguf::GgufFile::open((dir / "spm" / "vocab.gguf").string());
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(file);
  const nlohmann::json strings = read_json(dir / "cases.json")["strings"];
  const nlohmann::json expected = read_json(dir / "spm" / "llamacpp_ids.json");
  ASSERT_GE(strings.size(), 2000u);
  ASSERT_EQ(expected["ids"].size(), strings.size());
  int id_mismatches = 0, decode_mismatches = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string s = strings[i].get<std::string>();
    const std::vector<int32_t> want = expected["ids"][i].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok->encode(s, /*add_bos=*/false, /*parse_special=*/true);
    if (got != want && ++id_mismatches <= 5)
      ADD_FAILURE() << "case " << i << " '" << s << "': " << ::testing::PrintToString(got) << " vs llama.cpp "
                    << ::testing::PrintToString(want);
    // llama.cpp's detokenize keeps the space prefix it added; kiln's decode takes it off.
    std::string want_text = expected["decoded"][i].get<std::string>();
    if (!want_text.empty() && want_text[0] == ' ') want_text.erase(0, 1);
    if (tok->decode(got) != want_text && ++decode_mismatches <= 5)
      ADD_FAILURE() << "decode case " << i << " '" << s << "' gave '" << tok->decode(got) << "'";
  }
  EXPECT_EQ(id_mismatches, 0);
  EXPECT_EQ(decode_mismatches, 0);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_TRUE(tok->add_bos_default());
  EXPECT_TRUE(tok->is_end_of_generation(2));  // </s>
}

// "▁" spelled out, for readability below.
const std::string kMark = "\xE2\x96\x81";

// A tiny vocabulary: <unk> <s> </s>, byte tokens for 'x' and 0xC3 0xA9 (é), characters and merges.
SpmVocab tiny_vocab() {
  SpmVocab v;
  auto add = [&](std::string text, float score, TokenType type = TokenType::normal) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, TokenType::unknown);        // 0
  add("<s>", 0, TokenType::control);          // 1
  add("</s>", 0, TokenType::control);         // 2
  add("<0x78>", 0, TokenType::byte);          // 3  'x'
  add("<0xC3>", 0, TokenType::byte);          // 4
  add("<0xA9>", 0, TokenType::byte);          // 5
  add(kMark, -1);                             // 6
  add("a", -2);                               // 7
  add("b", -3);                               // 8
  add("c", -4);                               // 9
  add("ab", -5);                              // 10
  add("bc", -0.5f);                           // 11: scores higher than "ab", so "abc" -> a + bc
  add(kMark + "a", -6);                       // 12
  add(kMark + "abc", -7);                     // 13: reachable only through "▁a" + "bc"
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  return v;
}

TEST(TokenizerSpm, HighestScoringPairMergesFirst) {
  SpmTokenizer tok(tiny_vocab());
  // "▁abc": ▁ a b c -> (bc scores best) ▁ a bc -> ▁a bc -> ▁abc.
  EXPECT_EQ(tok.encode("abc", false, false), (std::vector<int32_t>{13}));
  // "ab" alone: ▁ a b -> "▁a" (-6) vs "ab" (-5): ab first, then ▁ + ab has no token.
  EXPECT_EQ(tok.encode("ab", false, false), (std::vector<int32_t>{6, 10}));
  EXPECT_EQ(tok.decode(tok.encode("ab", false, false)), "ab");
}

TEST(TokenizerSpm, ByteFallbackAndUnknown) {
  SpmTokenizer tok(tiny_vocab());
  // 'x' has no character token: its byte token; 'é' is two byte tokens; 'z' has neither: <unk>.
  EXPECT_EQ(tok.encode("x\xC3\xA9z", false, false), (std::vector<int32_t>{6, 3, 4, 5, 0}));
  EXPECT_EQ(tok.token_bytes(4) + tok.token_bytes(5), "\xC3\xA9");
}

TEST(TokenizerSpm, SpacePrefixAtStartAndAfterSpecialTokens) {
  SpmTokenizer tok(tiny_vocab());
  // llama.cpp: a "▁" before the text and after each special token, BOS first when asked.
  EXPECT_EQ(tok.encode("a</s>a", true, true), (std::vector<int32_t>{1, 12, 2, 12}));
  // Without parse_special the control token is text.
  EXPECT_NE(tok.encode("a</s>a", false, false), (std::vector<int32_t>{12, 2, 12}));
  SpmVocab no_prefix = tiny_vocab();
  no_prefix.add_space_prefix = false;
  SpmTokenizer plain(std::move(no_prefix));
  EXPECT_EQ(plain.encode("a b", false, false), (std::vector<int32_t>{7, 6, 8}));
  EXPECT_EQ(plain.decode({7, 6, 8}), "a b");
}

TEST(TokenizerSpm, InconsistentVocabularyIsInvalidModel) {
  using test::expect_error;
  SpmVocab v = tiny_vocab();
  v.scores.pop_back();
  expect_error([&] { SpmTokenizer{v}; }, "tokenizer.ggml.scores has 13 entries", Errc::invalid_model);
  v = tiny_vocab();
  v.tokens[3] = "<0xZZ>";  // a byte token that is not <0xXX>
  expect_error([&] { SpmTokenizer{v}; }, "not <0xXX>", Errc::invalid_model);
  v = tiny_vocab();
  v.bos_id = 99;
  expect_error([&] { SpmTokenizer{v}; }, "outside the vocabulary", Errc::invalid_model);
}

}  // namespace
}  // namespace kiln
