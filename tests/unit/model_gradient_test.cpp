// The hand-written backward (quant/model_gradient.h): its forward gives CpuBackend's logits, and its
// weight gradients match central finite differences for entries of every matrix of every layer, on
// the tiny model under grouped-query attention, with and without q/k/v biases.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "quant/model_gradient.h"
#include "tiny_model.h"

namespace kiln {
namespace {

std::vector<int32_t> window() {
  std::vector<int32_t> t = test::calibration_tokens();
  t.resize(24);
  return t;
}

TEST(ModelGradient, ForwardGivesTheCpuBackendsLogits) {
  ThreadPool pool(2);
  for (bool bias : {false, true}) {
    ModelConfig c = test::tiny_config();
    c.qkv_bias = bias;
    const ModelWeights w = random_weights(c, 5, 0.5f);
    const std::vector<int32_t> tokens = window();
    CpuBackend b(c, w, pool);
    auto seq = b.new_sequence(int64_t(tokens.size()));
    std::vector<float> want, got;
    b.forward(*seq, tokens, true, want);
    quant::model_logits(c, w, pool, tokens, got);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
  }
}

class GradientCheck : public ::testing::TestWithParam<bool> {};

// L = sum_ij c_ij logits_ij for fixed random c: dL/dlogits = c, and the finite differences of L in one
// weight go through every operator of the network.
TEST_P(GradientCheck, MatchesFiniteDifferences) {
  ThreadPool pool(2);
  ModelConfig c = test::tiny_config();
  c.qkv_bias = GetParam();
  ModelWeights w = random_weights(c, 9, 0.5f);
  for (float& g : w.layers[1].attn_norm.data) g *= 1.5f;  // norms away from one value
  const std::vector<int32_t> tokens = window();
  std::vector<float> coef(tokens.size() * size_t(c.vocab_size));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (float& x : coef) x = normal(rng);
  auto loss_of = [&](const ModelWeights& m) {
    std::vector<float> logits;
    quant::model_logits(c, m, pool, tokens, logits);
    double s = 0;
    for (size_t i = 0; i < logits.size(); ++i) s += double(coef[i]) * logits[i];
    return s;
  };
  std::map<std::pair<int64_t, int>, std::vector<float>> grads;
  const double value = quant::model_gradient(
      c, w, pool, tokens,
      [&](const float* logits, float* dlogits, int64_t n, int64_t vocab) {
        double s = 0;
        for (int64_t i = 0; i < n * vocab; ++i) {
          s += double(coef[size_t(i)]) * logits[i];
          dlogits[i] = coef[size_t(i)];
        }
        return s;
      },
      [&](int64_t layer, quant::LayerMatrix m, const float* g) {
        const HostMatrix& h = quant::layer_matrix(w.layers[size_t(layer)], m);
        grads[{layer, int(m)}].assign(g, g + h.rows * h.cols);
      });
  EXPECT_NEAR(value, loss_of(w), 1e-3 * std::fabs(value) + 1e-3);
  ASSERT_EQ(grads.size(), size_t(c.n_layers * quant::kLayerMatrices));

  const float eps = 1e-2f;
  std::uniform_int_distribution<int64_t> pick(0, 1 << 30);
  for (int64_t layer = 0; layer < c.n_layers; ++layer)
    for (int m = 0; m < quant::kLayerMatrices; ++m) {
      const std::vector<float>& g = grads.at({layer, m});
      float gmax = 0;
      for (float x : g) gmax = std::max(gmax, std::fabs(x));
      ASSERT_GT(gmax, 0.0f);
      for (int probe = 0; probe < 3; ++probe) {
        // The largest entry, then two random ones.
        size_t at = probe == 0 ? size_t(std::max_element(g.begin(), g.end(), [](float a, float b) {
                                   return std::fabs(a) < std::fabs(b);
                                 }) - g.begin())
                               : size_t(pick(rng)) % g.size();
        ModelWeights plus = w, minus = w;
        quant::layer_matrix(plus.layers[size_t(layer)], quant::LayerMatrix(m)).data[at] += eps;
        quant::layer_matrix(minus.layers[size_t(layer)], quant::LayerMatrix(m)).data[at] -= eps;
        const double numeric = (loss_of(plus) - loss_of(minus)) / (2.0 * eps);
        EXPECT_NEAR(g[at], numeric, 0.02 * std::fabs(numeric) + 2e-3 * gmax)
            << "layer " << layer << " matrix " << m << " entry " << at;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Biases, GradientCheck, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "WithBias" : "NoBias"); });

}  // namespace
}  // namespace kiln
