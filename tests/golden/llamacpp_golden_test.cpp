// The default model against llama.cpp (fixtures from python/make_golden.py: llama-cpp-python
// 0.3.36 on the same GGUF, fp32 KV cache, no flash attention): identical token ids, logits within a measured tolerance, the same
// argmax wherever llama.cpp's own margin exceeds that tolerance, and greedy continuations that
// agree until the first step where llama.cpp itself was within the tolerance of a tie.
//
// Why logits differ at all: llama.cpp rounds activations to 8 bits (Q8_1, per block of 32) inside
// its Q4_1 and Q8_0 matrix products and keeps the KV cache in fp16; kiln's CPU reference
// dequantizes the weights to fp32 and computes in fp32. kiln agrees with an independent float64
// NumPy forward pass to 4e-5 (numpy_reference_test.cpp), so the difference measured here is
// llama.cpp's quantized arithmetic: on these 9 prompts (985 positions, top-16 logits each) it was
// max 1.81 and mean 0.18 (2026-11-30). Emulating the Q8_1 rounding of activations in kiln did not
// shrink it (mean 0.20), so some of llama.cpp's rounding is elsewhere; we did not chase it further. A real bug (a wrong RoPE pair, norm epsilon or transposed
// weight) moves logits by several units everywhere and fails the mean bound at once.
#include <gtest/gtest.h>

#include "golden_model.h"
#include "runtime/sampler.h"

namespace kiln {
namespace {

constexpr double kMaxLogitDelta = 2.5;   // measured 1.84
constexpr double kMeanLogitDelta = 0.3;  // measured 0.19
// Where llama.cpp's best two logits are closer than this, its argmax is within its own rounding
// noise (every position that flipped had a llama.cpp margin under 0.5) and either token is a
// correct answer.
constexpr double kTieMargin = 0.5;

using test::golden_model;

TEST(LlamaCppGolden, TokenIdsMatch) {
  KILN_REQUIRE_MODEL(test::default_model_path());
  const auto fixture = test::load_golden_fixture("smollm2_llamacpp.json");
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto ids = golden_model()->model.tokenizer->encode(c["text"].get<std::string>(), false, c["parse_special"].get<bool>());
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
  }
}

TEST(LlamaCppGolden, LogitsAndArgmaxMatchAtEveryPosition) {
  KILN_REQUIRE_MODEL(test::default_model_path());
  auto& backend = *golden_model()->backend;
  const size_t vocab = size_t(backend.config().vocab_size);
  const auto fixture = test::load_golden_fixture("smollm2_llamacpp.json");
  double worst = 0, sum = 0;
  size_t count = 0, positions = 0, near_ties = 0, flipped_near_ties = 0;
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto ids = c["ids"].get<std::vector<int32_t>>();
    std::vector<float> logits = test::all_logits(backend, ids);
    ASSERT_EQ(logits.size(), ids.size() * vocab);
    for (size_t t = 0; t < ids.size(); ++t, ++positions) {
      const float* row = logits.data() + t * vocab;
      auto top_ids = c["top_ids"][t].get<std::vector<int32_t>>();
      auto top_logits = c["top_logits"][t].get<std::vector<double>>();
      int32_t ours = Sampler::argmax({row, vocab});
      if (c["top1_gap"][t].get<double>() > kTieMargin) {
        EXPECT_EQ(ours, top_ids[0]) << "position " << t;
      } else {
        ++near_ties;
        // Our pick must be one of llama.cpp's candidates within the margin of its best.
        auto it = std::find(top_ids.begin(), top_ids.end(), ours);
        ASSERT_NE(it, top_ids.end()) << "position " << t << ": kiln's argmax is not in llama.cpp's top-16";
        EXPECT_GE(top_logits[size_t(it - top_ids.begin())], top_logits[0] - kTieMargin) << "position " << t;
        flipped_near_ties += ours != top_ids[0];
      }
      for (size_t k = 0; k < top_ids.size(); ++k) {
        double d = std::fabs(double(row[top_ids[k]]) - top_logits[k]);
        worst = std::max(worst, d);
        sum += d;
        ++count;
      }
    }
  }
  std::printf("max |dlogit| = %.4f, mean = %.4f over %zu entries; %zu of %zu positions are near-ties, %zu flipped\n",
              worst, sum / double(count), count, near_ties, positions, flipped_near_ties);
  EXPECT_LE(worst, kMaxLogitDelta);
  EXPECT_LE(sum / double(count), kMeanLogitDelta);
  EXPECT_LE(near_ties, positions / 5) << "too many near-ties for the argmax check to mean anything";
}

TEST(LlamaCppGolden, GreedyContinuationIsIdenticalUntilANearTie) {
  KILN_REQUIRE_MODEL(test::default_model_path());
  auto& backend = *golden_model()->backend;
  const auto fixture = test::load_golden_fixture("smollm2_llamacpp.json");
  size_t fully_identical = 0, n_cases = 0, compared_tokens = 0;
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ++n_cases;
    auto ids = c["ids"].get<std::vector<int32_t>>();
    auto expected = c["greedy"].get<std::vector<int32_t>>();
    auto gaps = c["greedy_gap"].get<std::vector<double>>();
    auto seq = backend.new_sequence(int64_t(ids.size() + expected.size()));
    std::vector<float> logits;
    backend.forward(*seq, ids, false, logits);
    size_t i = 0;
    for (; i < expected.size(); ++i) {
      if (gaps[i] <= kTieMargin) break;  // llama.cpp itself was within rounding of a tie here
      int32_t tok = Sampler::argmax(logits);
      ASSERT_EQ(tok, expected[i]) << "greedy token " << i << " (llama.cpp margin " << gaps[i] << ")";
      backend.forward(*seq, std::span<const int32_t>(&tok, 1), false, logits);
    }
    compared_tokens += i;
    fully_identical += i == expected.size();
  }
  std::printf("greedy: %zu of %zu cases identical for all 64 tokens; %zu tokens compared\n", fully_identical, n_cases,
              compared_tokens);
  // Measured 2026-11-30: see docs/BENCHMARKS.md. Guards against the comparison silently
  // shrinking to nothing (a fixture full of near-ties would make this test vacuous).
  EXPECT_GE(fully_identical, 1u);
  EXPECT_GE(compared_tokens, 60u);
}

}  // namespace
}  // namespace kiln
