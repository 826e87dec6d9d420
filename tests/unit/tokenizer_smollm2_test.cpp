// Parity with Hugging Face tokenizers on SmolLM2's real vocabulary. The fixture
// (tests/data/tokenizer/smollm2_ids.json) is recorded by python/make_tokenizer_fixture.py; the
// model file comes from KILN_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf in the source tree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

std::filesystem::path model_path() {
  if (const char* env = std::getenv("KILN_MODEL"); env && *env) return env;
  return std::filesystem::path(KILN_TEST_DATA) / ".." / ".." / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;  // the text again, less the bytes the vocabulary has no token for
};

std::vector<Case> load_fixture() {
  const std::filesystem::path path = std::filesystem::path(KILN_TEST_DATA) / "tokenizer" / "smollm2_ids.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  const nlohmann::json json = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& item : json) {
    Case c{item.at("text").get<std::string>(), item.at("ids").get<std::vector<int32_t>>(), {}};
    c.decoded = item.value("decoded", c.text);
    cases.push_back(std::move(c));
  }
  return cases;
}

class TokenizerSmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::filesystem::path path = model_path();
    if (!std::filesystem::exists(path)) return;
    file_ = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(path.string()));
    tokenizer_ = Tokenizer::from_gguf(*file_);
  }
  static void TearDownTestSuite() {
    tokenizer_.reset();
    file_.reset();
  }
  void SetUp() override {
    if (!tokenizer_) {
      GTEST_SKIP() << "model file " << model_path()
                   << " not found: set KILN_MODEL or fetch the default model (scripts/) to run the parity tests";
    }
  }

  static std::unique_ptr<gguf::GgufFile> file_;
  static std::unique_ptr<Tokenizer> tokenizer_;
};

std::unique_ptr<gguf::GgufFile> TokenizerSmolLM2::file_;
std::unique_ptr<Tokenizer> TokenizerSmolLM2::tokenizer_;

TEST_F(TokenizerSmolLM2, Metadata) {
  EXPECT_EQ(tokenizer_->vocab_size(), 49152);
  EXPECT_EQ(tokenizer_->bos_id(), 1);
  EXPECT_EQ(tokenizer_->eos_id(), 2);
  EXPECT_FALSE(tokenizer_->add_bos_default());
  EXPECT_TRUE(tokenizer_->is_end_of_generation(2));  // <|im_end|>
  EXPECT_TRUE(tokenizer_->is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(tokenizer_->is_end_of_generation(1));  // <|im_start|>
  EXPECT_EQ(tokenizer_->find_token("<|im_start|>"), 1);
  EXPECT_EQ(tokenizer_->token_bytes(1), "<|im_start|>");
}

TEST_F(TokenizerSmolLM2, IdsMatchHuggingFaceTokenizers) {
  const std::vector<Case> cases = load_fixture();
  ASSERT_GE(cases.size(), 2000u);
  int mismatches = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = tokenizer_->encode(c.text, /*add_bos=*/false, /*parse_special=*/true);
    EXPECT_EQ(ids, c.ids) << "text: " << nlohmann::json(c.text).dump();
    mismatches += ids != c.ids;
    EXPECT_EQ(tokenizer_->decode(ids), c.decoded) << "text: " << nlohmann::json(c.text).dump();
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " cases";
}

TEST_F(TokenizerSmolLM2, StreamingReproducesTheText) {
  for (const Case& c : load_fixture()) {
    StreamingDetokenizer detok(*tokenizer_);
    std::string streamed;
    for (int32_t id : c.ids) {
      const std::string chunk = detok.push(id);
      ASSERT_EQ(utf8::valid_prefix_length(chunk), chunk.size()) << "chunk ends inside a character";
      streamed += chunk;
    }
    streamed += detok.flush();
    EXPECT_EQ(streamed, c.decoded);
  }
}

TEST_F(TokenizerSmolLM2, SpecialTokensAreTextWithoutParseSpecial) {
  const std::vector<int32_t> ids = tokenizer_->encode("<|im_start|>user", false, false);
  EXPECT_GT(ids.size(), 2u);
  for (int32_t id : ids) EXPECT_NE(id, 1);
  EXPECT_EQ(tokenizer_->decode(ids), "<|im_start|>user");
  EXPECT_EQ(tokenizer_->encode("hi", true, true), (std::vector<int32_t>{1, tokenizer_->encode("hi", false, true)[0]}));
}

TEST_F(TokenizerSmolLM2, ArbitraryBytesNeverThrowAndDecodeToValidUtf8) {
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = char(rng() % 3 == 0 ? rng() % 256 : ' ' + rng() % 95);
    const std::vector<int32_t> ids = tokenizer_->encode(bytes, false, true);
    const std::string text = tokenizer_->decode(ids);
    EXPECT_EQ(utf8::valid_prefix_length(text), text.size());
  }
}

TEST_F(TokenizerSmolLM2, ConcurrentEncodesAgree) {
  // One tokenizer serves every request thread: encode must be safe to call concurrently.
  const std::vector<Case> cases = load_fixture();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        for (const Case& c : cases) mismatches[t] += tokenizer_->encode(c.text, false, true) != c.ids;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST_F(TokenizerSmolLM2, Throughput) {
  // Several megabytes of the fixture's varied text; reports MB/s (not asserted: the machine is shared).
  std::string corpus;
  const std::vector<Case> cases = load_fixture();
  while (corpus.size() < (4u << 20)) {
    for (const Case& c : cases) {
      if (c.decoded == c.text) corpus.append(c.text).append("\n");
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tokenizer_->encode(corpus, false, true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double mb_per_s = corpus.size() / 1e6 / seconds;
  std::printf("[ tokenizer ] %.1f MB -> %zu tokens in %.3f s: %.1f MB/s\n", corpus.size() / 1e6, ids.size(), seconds,
              mb_per_s);
  RecordProperty("encode_MB_per_s", std::to_string(mb_per_s));
  EXPECT_EQ(tokenizer_->decode(ids), corpus);
}

}  // namespace
}  // namespace kiln
