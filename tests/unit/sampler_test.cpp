#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "kiln/error.h"
#include "runtime/sampler.h"

namespace kiln {
namespace {

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(greedy());
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(logits, {}), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 42;
  std::vector<float> base(100);
  for (int i = 0; i < 100; ++i) base[i] = std::sin(float(i));
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      auto l = base;
      out.push_back(s.sample(l, {}));
    }
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  Sampler s(p);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> logits = {1.0f, 3.0f, 2.9f};
    EXPECT_EQ(s.sample(logits, {}), 1);
  }
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  // logits log(1), log(2), log(7): probabilities 0.1, 0.2, 0.7 at temperature 1.
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 7;
  Sampler s(p);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> logits = {std::log(1.0f), std::log(2.0f), std::log(7.0f)};
    ++counts[s.sample(logits, {})];
  }
  EXPECT_NEAR(counts[0] / double(n), 0.1, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 0.2, 0.01);
  EXPECT_NEAR(counts[2] / double(n), 0.7, 0.01);
}

TEST(Sampler, TopPAndMinPCutTheTail) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.min_p = 0;
  p.top_p = 0.65f;  // 0.7 alone covers it: only token 2 survives
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> logits = {std::log(1.0f), std::log(2.0f), std::log(7.0f)};
    EXPECT_EQ(s.sample(logits, {}), 2);
  }
  p.top_p = 1.0f;
  p.min_p = 0.25f;  // keeps p >= 0.175: tokens 1 and 2
  Sampler m(p);
  for (int i = 0; i < 500; ++i) {
    std::vector<float> logits = {std::log(1.0f), std::log(2.0f), std::log(7.0f)};
    EXPECT_NE(m.sample(logits, {}), 0);
  }
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams p = greedy();
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> logits = {3.0f, 2.0f, -1.0f};
  std::vector<int32_t> history = {0, 2};
  EXPECT_EQ(s.sample(logits, history), 1);  // 3 -> 1.5 < 2
  EXPECT_FLOAT_EQ(logits[0], 1.5f);
  EXPECT_FLOAT_EQ(logits[2], -2.0f);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  SamplingParams p = greedy();
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  std::vector<float> logits = {1.0f, 1.0f};
  std::vector<int32_t> history = {0, 0, 0};
  s.sample(logits, history);
  EXPECT_FLOAT_EQ(logits[0], 1.0f - 0.5f - 0.75f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f);
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  auto bad = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    EXPECT_THROW(p.validate(), Error);
  };
  bad([](SamplingParams& p) { p.temperature = NAN; });
  bad([](SamplingParams& p) { p.temperature = -1; });
  bad([](SamplingParams& p) { p.top_p = 0; });
  bad([](SamplingParams& p) { p.top_p = 1.5f; });
  bad([](SamplingParams& p) { p.min_p = -0.1f; });
  bad([](SamplingParams& p) { p.repetition_penalty = 0; });
  bad([](SamplingParams& p) { p.presence_penalty = 3; });
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Sampler, InfiniteScaledLogitsTakeTheArgmax) {
  // A temperature that validate() allows but whose 1/T overflows the scaled logits, an infinite
  // logit, or only -inf ones: the scaled max is not finite and max - max would be NaN (every draw
  // then fell through to the last survivor); the limit of the distribution is the argmax, as on
  // the device (sampling.cu).
  SamplingParams p;
  p.top_k = 0;
  p.top_p = 0.9f;
  p.min_p = 0;  // (min_p's cut at NaN kept one survivor, the argmax, by accident)
  for (const float t : {1e-38f, 1.0f}) {
    p.temperature = t;
    for (uint64_t seed = 0; seed < 16; ++seed) {
      p.seed = seed;
      Sampler s(p);
      std::vector<float> tiny_t = {1.0f, 3.0f, -2.0f, 2.5f};
      std::vector<float> inf = {1.0f, INFINITY, 2.0f, INFINITY};
      std::vector<float> all_neg_inf = {-INFINITY, -INFINITY, -INFINITY};
      if (t < 1e-30f) EXPECT_EQ(s.sample(tiny_t, {}), 1);
      EXPECT_EQ(s.sample(inf, {}), 1);
      EXPECT_EQ(s.sample(all_neg_inf, {}), 0);
    }
  }
}

TEST(Sampler, GreedyNeverPicksNaN) {
  std::vector<float> logits = {NAN, 1.0f, NAN, 3.0f, NAN};
  EXPECT_EQ(Sampler::argmax(logits), 3);
  std::vector<float> all_nan = {NAN, NAN};
  EXPECT_THROW(Sampler::argmax(all_nan), Error);
}

}  // namespace
}  // namespace kiln
