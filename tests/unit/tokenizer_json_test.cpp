// Tokenizer::from_tokenizer_json: parity with Hugging Face tokenizers on small byte-level BPE
// vocabularies (tests/data/tokenizer_json/, made by python/make_tokenizer_json_fixture.py), the
// forms kiln refuses, and loading tokenizer.json from a Hugging Face model directory.
#include <gtest/gtest.h>

#include "core/text_file.h"
#include "expect_error.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kiln/error.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

fs::path data_dir() { return fs::path(KILN_TEST_DATA) / "tokenizer_json"; }

std::string read_text(const fs::path& p) { return read_text_file(p.string(), "test data"); }

const nlohmann::json& cases() {
  static const nlohmann::json j = nlohmann::json::parse(read_text(data_dir() / "cases.json"));
  return j;
}

using test::expect_error;

class TokenizerJsonParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerJsonParity, MatchesHuggingFaceIdsAndDecodedText) {
  const std::string kind = GetParam();
  auto tok = Tokenizer::from_tokenizer_json((data_dir() / kind / "tokenizer.json").string());
  const auto& strings = cases()["strings"];
  const auto& expected = cases()["ids"][kind];
  const auto& decoded = cases()["decoded"][kind];
  ASSERT_EQ(strings.size(), expected.size());
  ASSERT_EQ(strings.size(), decoded.size());
  ASSERT_GE(strings.size(), 2000u);
  int id_mismatches = 0, decode_mismatches = 0, round_trips = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string s = strings[i].get<std::string>();
    const std::vector<int32_t> want = expected[i].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok->encode(s, /*add_bos=*/false, /*parse_special=*/true);
    if (got != want && ++id_mismatches <= 5) {
      ADD_FAILURE() << kind << " case " << i << " '" << s << "': " << ::testing::PrintToString(got) << " vs HF "
                    << ::testing::PrintToString(want);
    }
    // HF's decode is the input itself except where the form changes text (NFC, lstrip/rstrip
    // tokens, SentencePiece's leading space); kiln must give exactly what HF gives.
    const std::string text = tok->decode(got);
    if (text != decoded[i].get<std::string>() && ++decode_mismatches <= 5)
      ADD_FAILURE() << kind << " decode case " << i << " '" << s << "' gave '" << text << "'";
    round_trips += text == s;
  }
  EXPECT_EQ(id_mismatches, 0);
  EXPECT_EQ(decode_mismatches, 0);
  // decode(encode(s)) == s for nearly every string (all of them for the plain byte-level forms).
  EXPECT_GE(round_trips, int(strings.size()) * 9 / 10) << kind;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerJsonParity, ::testing::Values("llama3", "qwen2", "gpt2", "smollm", "qwen2_nfc",
                                                                      "spm_legacy", "spm_metaspace"));

TEST(TokenizerJson, AddedTokensSpecialOnlyWithParseSpecial) {
  auto tok = Tokenizer::from_tokenizer_json((data_dir() / "gpt2" / "tokenizer.json").string());
  EXPECT_EQ(tok->encode("<|im_end|>", false, true), (std::vector<int32_t>{2}));
  EXPECT_GT(tok->encode("<|im_end|>", false, false).size(), 1u);
  // A non-special added token is matched either way.
  EXPECT_EQ(tok->encode("<tool_call>", false, false), (std::vector<int32_t>{2000}));
  EXPECT_EQ(tok->find_token("<tool_call>"), 2000);
  EXPECT_EQ(tok->token_bytes(2000), "<tool_call>");
  // lstrip + rstrip: the spaces around <|mask|> belong to it.
  EXPECT_EQ(tok->encode("a <|mask|>  b", false, true), tok->encode("a<|mask|>b", false, true));
  EXPECT_TRUE(tok->is_end_of_generation(2));  // <|im_end|> by its text
  EXPECT_EQ(tok->bos_id(), -1);               // no tokenizer_config.json beside it
  EXPECT_FALSE(tok->add_bos_default());
}

TEST(TokenizerJson, BosEosFromTokenizerConfigAndModelEosIds) {
  auto tok = Tokenizer::from_tokenizer_json((data_dir() / "llama3" / "tokenizer.json").string(), {5, 99999});
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos_default());
  EXPECT_TRUE(tok->is_end_of_generation(2));
  EXPECT_TRUE(tok->is_end_of_generation(5));
  EXPECT_FALSE(tok->is_end_of_generation(6));
  const std::vector<int32_t> ids = tok->encode("hello", true, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(tok->vocab_size(), 2001);
}

TEST(TokenizerJson, StringMergesEqualPairMerges) {
  nlohmann::json doc = nlohmann::json::parse(read_text(data_dir() / "llama3" / "tokenizer.json"));
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : doc["model"]["merges"]) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  doc["model"]["merges"] = merges;
  auto pairs = Tokenizer::from_tokenizer_json((data_dir() / "llama3" / "tokenizer.json").string());
  auto strings = tokenizer_from_json_text(doc.dump(), "");
  for (const auto& s : cases()["strings"]) {
    const std::string text = s.get<std::string>();
    ASSERT_EQ(strings->encode(text, false, true), pairs->encode(text, false, true)) << text;
  }
}

// A minimal valid byte-level tokenizer.json (256 byte tokens, no merges), to mutate.
nlohmann::json minimal_doc() {
  nlohmann::json vocab = nlohmann::json::object();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    // GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the rest from U+0100 on.
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else {
      s.push_back(char(0xC0 | (cp >> 6)));
      s.push_back(char(0x80 | (cp & 0x3F)));
    }
    vocab[s] = b;
  }
  return nlohmann::json{
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array({{{"id", 256},
                                               {"content", "<|im_end|>"},
                                               {"single_word", false},
                                               {"lstrip", false},
                                               {"rstrip", false},
                                               {"normalized", false},
                                               {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
  };
}

// The fuzzer's seeds (tests/data/tokenizer_json_corpus, scripts/fuzz.sh) must stay tokenizers kiln
// builds, or the fuzzer would start from documents it rejects at once.
TEST(TokenizerJson, FuzzSeedsBuildAndRoundTrip) {
  int seeds = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(KILN_TEST_DATA) / "tokenizer_json_corpus")) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    ++seeds;
    const auto tok = tokenizer_from_json_text(read_text(entry.path()), "");
    const std::vector<int32_t> ids = tok->encode("Hello world, caf\xc3\xa9!", false, true);
    EXPECT_GT(ids.size(), 3u);
    EXPECT_NE(tok->decode(ids).find("caf\xc3\xa9!"), std::string::npos);
  }
  EXPECT_EQ(seeds, 4);
}

TEST(TokenizerJson, MinimalDocumentWorks) {
  auto tok = tokenizer_from_json_text(minimal_doc().dump(), "");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->encode("hi", false, true), (std::vector<int32_t>{'h', 'i'}));
  EXPECT_EQ(tok->decode(tok->encode("caf\xC3\xA9 \xF0\x9F\x98\x80", false, true)), "caf\xC3\xA9 \xF0\x9F\x98\x80");
}

TEST(TokenizerJson, IgnoreMergesEmitsAWholePreTokenFromTheVocab) {
  // The trained fixtures reach every token through merges, so ignore_merges changes none of their
  // ids; here "abc" is in the vocabulary with no merge leading to it (as in Llama 3's vocabulary).
  nlohmann::json doc = minimal_doc();
  doc["added_tokens"] = nlohmann::json::array();
  doc["model"]["vocab"]["abc"] = 256;
  EXPECT_EQ(tokenizer_from_json_text(doc.dump(), "")->encode("abc", false, true),
            (std::vector<int32_t>{'a', 'b', 'c'}));
  doc["model"]["ignore_merges"] = true;
  auto tok = tokenizer_from_json_text(doc.dump(), "");
  EXPECT_EQ(tok->encode("abc", false, true), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok->encode("abcd", false, true), (std::vector<int32_t>{'a', 'b', 'c', 'd'}));
}

TEST(TokenizerJson, RefusesUnsupportedForms) {
  {
    nlohmann::json doc = minimal_doc();
    doc["model"]["type"] = "WordPiece";
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "WordPiece", Errc::unsupported);
  }
  {
    nlohmann::json doc = minimal_doc();
    doc["pre_tokenizer"] = {{"type", "Whitespace"}};
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "'Whitespace'", Errc::unsupported);
  }
  {
    nlohmann::json doc = minimal_doc();
    doc["normalizer"] = {{"type", "NFKC"}};
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "NFKC", Errc::unsupported);
  }
  {
    nlohmann::json doc = minimal_doc();
    doc["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", " "}};
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "Regex", Errc::unsupported);
  }
  {
    nlohmann::json doc = minimal_doc();
    doc["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}};
    doc["decoder"] = {{"type", "ByteLevel"}};  // a byte-level decoder on a SentencePiece-style file
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "decoder 'ByteLevel'", Errc::unsupported);
  }
  {
    nlohmann::json doc = minimal_doc();
    doc["decoder"] = {{"type", "WordPiece"}};
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "decoder 'WordPiece'", Errc::unsupported);
  }
  {
    nlohmann::json doc = minimal_doc();
    doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "add_prefix_space", Errc::unsupported);
  }
}

TEST(TokenizerJson, MalformedIsInvalidModel) {
  expect_error([&] { tokenizer_from_json_text("{\"model\": {", ""); }, "tokenizer.json", Errc::invalid_model);
  expect_error([&] { tokenizer_from_json_text("[1, 2]", ""); }, "not a JSON object", Errc::invalid_model);
  expect_error([&] { tokenizer_from_json_text("{\"model\": 1, \"model\": 2}", ""); }, "", Errc::invalid_model);
  {
    nlohmann::json doc = minimal_doc();
    doc["model"]["vocab"]["xyz"] = "not an id";
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "non-integer id", Errc::invalid_model);
  }
  {
    nlohmann::json doc = minimal_doc();
    doc["model"]["merges"] = nlohmann::json::array({"a b c"});
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "merge", Errc::invalid_model);
  }
  {
    nlohmann::json doc = minimal_doc();
    doc["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "b"})});  // "ab" not in vocab
    expect_error([&] { tokenizer_from_json_text(doc.dump(), ""); }, "lacks", Errc::invalid_model);
  }
  expect_error([&] { tokenizer_from_json_text(minimal_doc().dump(), "{\"bos_token\": \"<nope>\"}"); }, "<nope>",
               Errc::invalid_model);
  expect_error([&] { tokenizer_from_json_text(minimal_doc().dump(), "{bad"); }, "tokenizer_config.json",
               Errc::invalid_model);
}

// A Hugging Face directory: the fixture model's files linked into a temporary folder with a tokenizer.json.
class HfDirWithTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_tokenizer_json_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const fs::path src = fs::path(KILN_TEST_DATA) / "hf" / "llama_tied_v1001";
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
      fs::create_symlink(fs::absolute(src / f), dir_ / f);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_tokenizer(const nlohmann::json& doc) { std::ofstream(dir_ / "tokenizer.json") << doc.dump(); }
  fs::path dir_;
  ThreadPool pool_{2};
};

TEST_F(HfDirWithTokenizer, LoadsSupportedTokenizerJson) {
  write_tokenizer(minimal_doc());
  LoadedModel m = load_model(dir_.string(), pool_);
  ASSERT_NE(m.tokenizer, nullptr);
  EXPECT_EQ(&require_tokenizer(m), m.tokenizer.get());
  EXPECT_EQ(m.tokenizer->encode("hi", false, true), (std::vector<int32_t>{'h', 'i'}));
  // generation_config.json's eos_token_id [0, 1000]: 0 is in the tokenizer and ends generation.
  EXPECT_TRUE(m.tokenizer->is_end_of_generation(0));
  EXPECT_TRUE(m.tokenizer->is_end_of_generation(256));  // <|im_end|>
  EXPECT_EQ(m.tokenizer->eos_id(), 0);
}

TEST_F(HfDirWithTokenizer, UnsupportedTokenizerJsonLeavesNullptrWithReason) {
  nlohmann::json doc = minimal_doc();
  doc["pre_tokenizer"] = {{"type", "Metaspace"}};
  write_tokenizer(doc);
  LoadedModel m = load_model(dir_.string(), pool_);
  EXPECT_EQ(m.tokenizer, nullptr);
  expect_error([&] { require_tokenizer(m); }, "Metaspace", Errc::unsupported);
}

TEST_F(HfDirWithTokenizer, MalformedTokenizerJsonFailsTheLoad) {
  std::ofstream(dir_ / "tokenizer.json") << "{\"model\": ";
  expect_error([&] { load_model(dir_.string(), pool_); }, "tokenizer.json", Errc::invalid_model);
}

}  // namespace
}  // namespace kiln
