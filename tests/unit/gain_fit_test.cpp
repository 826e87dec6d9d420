// The input-channel gain fit (quant/gain_fit.h): gains planted in the unquantized model at each
// kind of site (a norm, v's rows under grouped-query attention, up's rows) are found and folded so
// that the quantized model computes what the reference does; with nothing to correct nothing
// moves; layer 0's q/k/v error at gains of 1 is GPTQ's own output error; a matrix that is not
// int4 is refused.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"
#include "quant/calibration.h"
#include "quant/gain_fit.h"
#include "quant/gptq.h"
#include "quant/quantize_model.h"
#include "tiny_model.h"

namespace kiln {
namespace {

// The tiny model with every linear matrix int4 (round to nearest, group 32).
ModelWeights int4_model(const ModelConfig& c) {
  ModelWeights w = random_weights(c, 13, 0.5f);
  for (LayerWeights& l : w.layers)
    for (HostMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      quant::quantize_matrix(*m, quant::TargetType::int4, 32);
  return w;
}

std::vector<float> gains(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.7f, 1.4f);
  std::vector<float> g(static_cast<size_t>(n));
  for (float& x : g) x = u(rng);
  return g;
}

void scale_columns(HostMatrix& m, const std::vector<float>& g) {
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t k = 0; k < m.cols; ++k) m.data[size_t(r * m.cols + k)] *= g[size_t(k)];
}

using test::all_logits;

// The reference is the int4 model itself with gains planted on the inputs of layer 0's q/k/v (its
// attn_norm) and o (o's columns, one gain per v channel: two query heads read each here) and of
// layer 1's gate/up (ffn_norm) and down (down's columns). Every one is a gain the fit can
// represent, so with no ridge it finds them all: each site's error falls to ~0 and the fitted
// model's logits are the reference's. The int4 codes never change.
TEST(GainFit, FindsGainsPlantedAtEveryKindOfSite) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  ModelWeights w = int4_model(c), ref = w;
  const std::vector<float> g_attn = gains(c.hidden_size, 1), g_v = gains(c.kv_dim(), 2),
                           g_ffn = gains(c.hidden_size, 3), g_down = gains(c.intermediate_size, 4);
  std::vector<float> g_o(static_cast<size_t>(c.q_dim()));  // o's input channel i reads v's channel
  const int64_t heads_per_kv = c.n_heads / c.n_kv_heads;
  for (int64_t i = 0; i < c.q_dim(); ++i)
    g_o[size_t(i)] = g_v[size_t((i / c.head_dim) / heads_per_kv * c.head_dim + i % c.head_dim)];
  for (int64_t i = 0; i < c.hidden_size; ++i) ref.layers[0].attn_norm.data[size_t(i)] *= g_attn[size_t(i)];
  scale_columns(ref.layers[0].wo, g_o);
  for (int64_t i = 0; i < c.hidden_size; ++i) ref.layers[1].ffn_norm.data[size_t(i)] *= g_ffn[size_t(i)];
  scale_columns(ref.layers[1].w_down, g_down);
  const std::vector<uint8_t> codes_v = w.layers[0].wv.quant.q, codes_up = w.layers[1].w_up.quant.q;

  const std::vector<int32_t> tokens = test::calibration_tokens();
  std::vector<quant::GainFitReport> reports;
  quant::fit_channel_gains(c, ref, w, pool, tokens, 32, 0.0,
                           [&](const quant::GainFitReport& r) { reports.push_back(r); });
  ASSERT_EQ(reports.size(), 8u);  // 2 layers x 4 sites
  for (const quant::GainFitReport& r : reports) {
    const bool planted = (r.layer == 0 && (r.site == "q/k/v" || r.site == "o")) ||
                         (r.layer == 1 && (r.site == "gate/up" || r.site == "down"));
    SCOPED_TRACE(testing::Message() << "layer " << r.layer << " " << r.site);
    if (planted) {
      EXPECT_TRUE(r.kept);
      EXPECT_GT(r.error_before, 0);
      EXPECT_LT(r.error_after, 1e-6 * r.error_before);
    } else {
      EXPECT_LE(std::abs(r.error_before), 1e-5 * reports.front().error_before);  // nothing to correct
    }
  }
  for (int64_t i = 0; i < c.hidden_size; ++i) {
    EXPECT_NEAR(w.layers[0].attn_norm.data[size_t(i)], ref.layers[0].attn_norm.data[size_t(i)],
                1e-4 * std::abs(ref.layers[0].attn_norm.data[size_t(i)]));
    EXPECT_NEAR(w.layers[1].ffn_norm.data[size_t(i)], ref.layers[1].ffn_norm.data[size_t(i)],
                1e-4 * std::abs(ref.layers[1].ffn_norm.data[size_t(i)]));
  }
  for (int64_t r = 0; r < c.kv_dim(); ++r)  // v's rows carry o's gains
    EXPECT_NEAR(w.layers[0].wv.quant.scales[size_t(r * w.layers[0].wv.quant.groups())],
                ref.layers[0].wv.quant.scales[size_t(r * w.layers[0].wv.quant.groups())] * g_v[size_t(r)],
                1e-4 * std::abs(ref.layers[0].wv.quant.scales[size_t(r * w.layers[0].wv.quant.groups())] * g_v[size_t(r)]));
  EXPECT_EQ(w.layers[0].wv.quant.q, codes_v);
  EXPECT_EQ(w.layers[1].w_up.quant.q, codes_up);
  // v's and up's values are their codes on the rescaled grids, as the kernels compute them.
  std::vector<float> row(size_t(c.hidden_size));
  quant::dequantize_row(w.layers[0].wv.quant, 3, row.data());
  for (int64_t k = 0; k < c.hidden_size; ++k) ASSERT_EQ(row[size_t(k)], w.layers[0].wv.data[size_t(3 * c.hidden_size + k)]);

  const std::vector<float> got = all_logits(c, w, pool, tokens), want = all_logits(c, ref, pool, tokens);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, double(std::abs(got[i] - want[i])));
    scale = std::max(scale, double(std::abs(want[i])));
  }
  EXPECT_LT(worst, 1e-3 * scale);
}

// With the reference equal to the quantized model every input matches, every site's error is 0 at
// gains of 1, and nothing is changed.
TEST(GainFit, LeavesAModelWithNothingToCorrectAsItIs) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  ModelWeights w = int4_model(c);
  const ModelWeights before = w;
  int sites = 0;
  quant::fit_channel_gains(c, before, w, pool, test::calibration_tokens(), 32, 0.01, [&](const quant::GainFitReport& r) {
    ++sites;
    EXPECT_FALSE(r.kept) << "layer " << r.layer << " " << r.site;
  });
  EXPECT_EQ(sites, 8);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    EXPECT_EQ(w.layers[l].attn_norm.data, before.layers[l].attn_norm.data);
    EXPECT_EQ(w.layers[l].ffn_norm.data, before.layers[l].ffn_norm.data);
    EXPECT_EQ(w.layers[l].wv.data, before.layers[l].wv.data);
    EXPECT_EQ(w.layers[l].w_up.quant.scales, before.layers[l].w_up.quant.scales);
  }
}

// Layer 0's q, k and v read the same inputs in both models, so the error at gains of 1 is the sum of
// their output errors d^T H d over the calibration rows (what GPTQ reports), and the fit lowers it.
TEST(GainFit, LayerZeroErrorIsTheMatricesOwnOutputError) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  const ModelWeights ref = random_weights(c, 13, 0.5f);
  ModelWeights w = int4_model(c);
  const std::vector<int32_t> tokens = test::calibration_tokens();
  const quant::Calibration cal = quant::calibrate(c, ref, pool, tokens, 32, 128);
  const std::vector<double> H = quant::input_hessian(cal.layers[0][0], pool);
  double want = 0;
  for (const HostMatrix* m : {&ref.layers[0].wq, &ref.layers[0].wk, &ref.layers[0].wv}) {
    const HostMatrix& q = m == &ref.layers[0].wq ? w.layers[0].wq : m == &ref.layers[0].wk ? w.layers[0].wk : w.layers[0].wv;
    want += quant::hessian_error(m->data.data(), q.quant, H, pool);
  }
  bool seen = false;
  quant::fit_channel_gains(c, ref, w, pool, tokens, 32, 0.01, [&](const quant::GainFitReport& r) {
    if (r.layer != 0 || r.site != "q/k/v") return;
    seen = true;
    EXPECT_NEAR(r.error_before, want, 1e-3 * want);
    EXPECT_TRUE(r.kept);
    EXPECT_LT(r.error_after, r.error_before);
  });
  EXPECT_TRUE(seen);
}

TEST(GainFit, RefusesAMatrixThatIsNotInt4) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  ModelWeights w = int4_model(c);
  quant::quantize_matrix(w.layers[1].wo, quant::TargetType::int8);
  EXPECT_THROW(quant::fit_channel_gains(c, w, w, pool, test::calibration_tokens(), 32, 0.01, nullptr), Error);
  EXPECT_THROW(quant::fit_channel_gains(c, w, w, pool, test::calibration_tokens(), 32, -1.0, nullptr), Error);
}

}  // namespace
}  // namespace kiln
