// The offline rotation of the residual stream and the values (quant/rotation.h): the random
// rotations are orthogonal and reproducible; a rotated model (tied or untied head, with and without
// q/k/v biases, under grouped-query attention) computes the logits it did, with norm weights of 1 and
// an untied head; quantized matrices come out dense; and a planted outlier column, which makes a
// round-to-nearest int4 grid coarse for every other column of its group, costs far less after it.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "quant/quantize_model.h"
#include "quant/rotation.h"
#include "tiny_model.h"

namespace kiln {
namespace {

std::vector<float> all_logits(const ModelConfig& c, const ModelWeights& w, ThreadPool& pool) {
  return test::all_logits(c, w, pool, test::calibration_tokens());
}

using test::max_abs;

TEST(Rotation, RandomOrthogonalIsOrthogonalAndReproducible) {
  for (int64_t n : {1, 7, 64, 97}) {
    const std::vector<double> q = quant::random_orthogonal(n, 42);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += q[size_t(i * n + k)] * q[size_t(j * n + k)];
        worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
      }
    EXPECT_LT(worst, 1e-13) << "n = " << n;
    EXPECT_EQ(q, quant::random_orthogonal(n, 42));
    if (n > 1) {
      EXPECT_NE(q, quant::random_orthogonal(n, 43));
    }
  }
}

struct Variant {
  bool tied, bias;
};

class RotatedModel : public ::testing::TestWithParam<Variant> {};

TEST_P(RotatedModel, ComputesTheSameLogits) {
  ThreadPool pool(2);
  ModelConfig c = test::tiny_config();  // 4 query heads on 2 kv heads
  c.tied_embeddings = GetParam().tied;
  c.qkv_bias = GetParam().bias;
  const ModelWeights original = random_weights(c, 11, 0.5f);
  ModelWeights w = original;
  for (HostMatrix* g : {&w.final_norm, &w.layers[0].attn_norm, &w.layers[1].ffn_norm})  // norms far from 1
    for (size_t k = 0; k < g->data.size(); ++k) g->data[k] = 0.5f + float(k % 5) * 0.3f;
  const std::vector<float> want = all_logits(c, w, pool);

  quant::rotate_model(c, w, pool, 5);
  EXPECT_FALSE(c.tied_embeddings);
  ASSERT_FALSE(w.lm_head.empty());
  for (const HostMatrix* g : {&w.final_norm, &w.layers[0].attn_norm, &w.layers[1].ffn_norm})
    for (float x : g->data) EXPECT_EQ(x, 1.0f);
  // Every matrix changed, not only moved: a weight is on the scale of the originals' but elsewhere.
  EXPECT_GT(std::fabs(w.layers[1].wq.data[3] - original.layers[1].wq.data[3]), 1e-3);
  EXPECT_GT(std::fabs(w.layers[1].wo.data[3] - original.layers[1].wo.data[3]), 1e-3);

  const std::vector<float> got = all_logits(c, w, pool);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
  EXPECT_LT(worst, 2e-5 * max_abs(want)) << "largest logit " << max_abs(want);
}

INSTANTIATE_TEST_SUITE_P(Heads, RotatedModel,
                         ::testing::Values(Variant{true, false}, Variant{false, false}, Variant{true, true}),
                         [](const auto& info) {
                           return std::string(info.param.tied ? "Tied" : "Untied") + (info.param.bias ? "Bias" : "");
                         });

TEST(Rotation, QuantizedMatricesComeOutDense) {
  ThreadPool pool(2);
  ModelConfig c = test::tiny_config();
  ModelWeights w = random_weights(c, 11, 0.5f);
  quant::quantize_matrix(w.layers[0].wq, quant::TargetType::int4, 32);
  quant::quantize_matrix(w.layers[0].wo, quant::TargetType::int8, 32);
  quant::rotate_model(c, w, pool, 1);
  EXPECT_EQ(w.layers[0].wq.quant.format, QuantFormat::none);
  EXPECT_EQ(w.layers[0].wo.quant.format, QuantFormat::none);
}

// Relative squared error of round-to-nearest int4 (group 32) on a matrix.
double int4_error(HostMatrix m) {
  const std::vector<float> exact = m.data;
  quant::quantize_matrix(m, quant::TargetType::int4, 32);
  double err = 0, norm = 0;
  for (size_t k = 0; k < exact.size(); ++k) {
    err += double(m.data[k] - exact[k]) * double(m.data[k] - exact[k]);
    norm += double(exact[k]) * double(exact[k]);
  }
  return err / norm;
}

// One input channel 30x the others (what the outlier channels of real models do to a group): the
// group holding it spends its 16 levels on that one value and rounds the other 31 to about nothing.
// After the rotation every value is a mix of all 64 columns, and the rounding error is about half
// (0.0056 against 0.0112 of the matrix's energy here).
TEST(Rotation, SpreadsAnOutlierColumnOverTheGroups) {
  ThreadPool pool(2);
  ModelConfig c = test::tiny_config();
  ModelWeights w = random_weights(c, 11, 0.5f);
  HostMatrix& gate = w.layers[0].w_gate;
  for (int64_t i = 0; i < gate.rows; ++i) gate.data[size_t(i * gate.cols + 9)] *= 30.0f;
  for (float& g : w.layers[0].ffn_norm.data) g = 1.0f;  // so that only the rotation changes the gate
  const double before = int4_error(gate);
  quant::rotate_model(c, w, pool, 3);
  const double after = int4_error(w.layers[0].w_gate);
  EXPECT_LT(after, 0.6 * before) << "before " << before << ", after " << after;
}

}  // namespace
}  // namespace kiln
