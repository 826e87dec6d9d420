// GPTQ (quant/gptq.h): the inverse factor is right, a diagonal Hessian gives round-to-nearest bit
// for bit, correlated inputs give a smaller output error than round-to-nearest, and on a tiny
// model every matrix's GPTQ error is at most its round-to-nearest error. Session 11's options:
// act-order's column order and permuted Hessian, the MSE grid never worse than the full range on
// its own loss, and both options still beating round-to-nearest on correlated inputs. Session 14's
// refit of the grids to the codes: exact where the codes fit a grid exactly, and never raising the
// output error GPTQ left. Session 20's coordinate descent on the codes: no move from
// round-to-nearest under a diagonal Hessian, and after GPTQ and the refit a lower error, row by row
// never a higher one, with the grids untouched. Session 21's damped refit and descent: closer
// weights, a higher calibration error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "quant/calibration.h"
#include "quant/gptq.h"
#include "quant/int4_descent.h"
#include "quant/quantize.h"
#include "tiny_model.h"

namespace kiln {
namespace {

// n rows of cols inputs with strongly correlated columns (a few shared factors plus noise), and
// some columns much larger than others: the regime where GPTQ's error feedback matters.
quant::SiteStats correlated_inputs(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  quant::SiteStats s;
  s.cols = cols;
  s.n_samples = n;
  s.samples.resize(size_t(n * cols));
  for (int64_t r = 0; r < n; ++r) {
    const float f0 = g(rng), f1 = g(rng);
    for (int64_t c = 0; c < cols; ++c)
      s.samples[size_t(r * cols + c)] =
          (1.0f + float(c % 7)) * (f0 + 0.5f * float(c % 3) * f1 + 0.3f * g(rng));
  }
  return s;
}

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 0.05f);
  std::vector<float> w(size_t(rows * cols));
  for (float& v : w) v = g(rng);
  return w;
}

// The share of two same-shape int4 matrices' code bytes that are equal.
double share_of_equal_code_bytes(const QuantizedMatrix& a, const QuantizedMatrix& b) {
  size_t same = 0;
  for (size_t i = 0; i < a.q.size(); ++i) same += a.q[i] == b.q[i];
  return double(same) / double(a.q.size());
}

TEST(Gptq, InverseFactorIsTheUpperCholeskyOfTheDampedInverse) {
  ThreadPool pool(2);
  const int64_t n = 48;
  const quant::SiteStats s = correlated_inputs(256, n, 3);
  const std::vector<double> H = quant::input_hessian(s, pool);
  const std::vector<float> U = quant::gptq_inverse_factor(H, n);
  double mean_diag = 0;
  for (int64_t i = 0; i < n; ++i) mean_diag += H[size_t(i * n + i)] / double(n);
  // (U^T U) (H + 0.01 mean_diag I) = I.
  double worst = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double v = 0;
      for (int64_t k = 0; k < n; ++k) {
        double inv_ik = 0;  // (U^T U)_ik
        for (int64_t m = 0; m <= std::min(i, k); ++m) inv_ik += double(U[size_t(m * n + i)]) * U[size_t(m * n + k)];
        v += inv_ik * (H[size_t(k * n + j)] + (k == j ? 0.01 * mean_diag : 0.0));
      }
      worst = std::max(worst, std::fabs(v - (i == j ? 1.0 : 0.0)));
      if (j < i) {
        EXPECT_EQ(U[size_t(i * n + j)], 0.0f) << "U is upper triangular";
      }
    }
  EXPECT_LT(worst, 1e-3);
}

TEST(Gptq, DiagonalHessianGivesRoundToNearest) {
  ThreadPool pool(2);
  const int64_t rows = 12, cols = 64, group = 32;
  const std::vector<float> w = random_matrix(rows, cols, 5);
  std::vector<double> H(size_t(cols * cols), 0.0);
  for (int64_t i = 0; i < cols; ++i) H[size_t(i * cols + i)] = 1.0 + double(i % 5);
  const QuantizedMatrix g = quant::gptq_int4(w.data(), rows, cols, group, quant::gptq_inverse_factor(H, cols), pool);
  const QuantizedMatrix r = quant::quantize_int4(w.data(), rows, cols, group);
  EXPECT_EQ(g.q, r.q);
  EXPECT_EQ(g.scales, r.scales);
  EXPECT_EQ(g.mins, r.mins);
}

TEST(Gptq, CorrelatedInputsLowerTheOutputError) {
  ThreadPool pool(2);
  const int64_t rows = 24, cols = 128, group = 32;
  const quant::SiteStats s = correlated_inputs(1024, cols, 7);
  const std::vector<double> H = quant::input_hessian(s, pool);
  const std::vector<float> w = random_matrix(rows, cols, 9);
  const QuantizedMatrix g = quant::gptq_int4(w.data(), rows, cols, group, quant::gptq_inverse_factor(H, cols), pool);
  quant::validate(g, "gptq");
  const double e_gptq = quant::hessian_error(w.data(), g, H, pool);
  const double e_rtn = quant::hessian_error(w.data(), quant::quantize_int4(w.data(), rows, cols, group), H, pool);
  EXPECT_LT(e_gptq, 0.8 * e_rtn) << "gptq " << e_gptq << " rtn " << e_rtn;
}

TEST(Gptq, OnATinyModelNoMatrixLosesToRoundToNearest) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  ModelWeights w = random_weights(c, 13, 0.5f);
  const std::vector<int32_t> tokens = test::calibration_tokens();
  const quant::Calibration cal = quant::calibrate(c, w, pool, tokens, 32, 128);
  int matrices = 0;
  quant::apply_gptq(w, cal, pool, 32, [&](const quant::GptqReport& r) {
    ++matrices;
    EXPECT_LE(r.error, r.error_rtn * (1.0 + 1e-6)) << "layer " << r.layer << " " << r.matrix;
  });
  EXPECT_EQ(matrices, 7 * c.n_layers);
  for (const LayerWeights& l : w.layers) {
    EXPECT_EQ(l.wq.quant.format, QuantFormat::int4);
    EXPECT_EQ(l.w_down.quant.format, QuantFormat::int4);
    // data holds the dequantized codes, as quantize_matrix leaves it.
    std::vector<float> row(size_t(l.w_down.cols));
    quant::dequantize_row(l.w_down.quant, 0, row.data());
    for (int64_t k = 0; k < l.w_down.cols; ++k) ASSERT_EQ(row[size_t(k)], l.w_down.data[size_t(k)]);
  }
}

// More refit rounds never end above one: each row keeps its best round (a GPTQ pass on refit
// grids can land a row higher), so every matrix's output error with 3 rounds is at most with 1.
TEST(Gptq, MoreRefitRoundsNeverRaiseAMatrixError) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  const std::vector<int32_t> tokens = test::calibration_tokens();
  std::vector<double> errors[2];
  for (int k = 0; k < 2; ++k) {
    ModelWeights w = random_weights(c, 13, 0.5f);
    quant::GptqOptions opt;
    opt.act_order = true;
    opt.mse_grid = true;
    opt.refit_rounds = k == 0 ? 1 : 3;
    quant::apply_gptq(w, quant::calibrate(c, w, pool, tokens, 32, 128), pool, 32,
                      [&](const quant::GptqReport& r) { errors[k].push_back(r.error); }, opt);
  }
  ASSERT_EQ(errors[0].size(), errors[1].size());
  for (size_t i = 0; i < errors[0].size(); ++i) EXPECT_LE(errors[1][i], errors[0][i] * (1 + 1e-9)) << "matrix " << i;
}

// The refit and descent on H damped (GptqOptions::fit_damp, session 21): a ridge on the weight
// error. A strong one (the mean diagonal) ends with the weights closer to the unquantized ones and
// a higher output error on the calibration rows than the undamped rounds.
TEST(Gptq, FitDampTradesOutputErrorForWeightError) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  const std::vector<int32_t> tokens = test::calibration_tokens();
  double output_error[2] = {0, 0}, weight_error[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const ModelWeights fp = random_weights(c, 13, 0.5f);
    ModelWeights w = fp;
    quant::GptqOptions opt;
    opt.act_order = opt.mse_grid = true;
    opt.refit_rounds = 1;
    opt.descent_rounds = 1;
    opt.fit_damp = k == 0 ? 0.0 : 1.0;
    quant::apply_gptq(w, quant::calibrate(c, w, pool, tokens, 32, 128), pool, 32,
                      [&](const quant::GptqReport& r) { output_error[k] += r.error; }, opt);
    for (size_t l = 0; l < w.layers.size(); ++l)
      for (auto m : {&LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv, &LayerWeights::wo,
                     &LayerWeights::w_gate, &LayerWeights::w_up, &LayerWeights::w_down}) {
        const std::vector<float>& a = (fp.layers[l].*m).data;
        const std::vector<float>& b = (w.layers[l].*m).data;
        for (size_t i = 0; i < a.size(); ++i) weight_error[k] += double(a[i] - b[i]) * double(a[i] - b[i]);
      }
  }
  EXPECT_LT(weight_error[1], weight_error[0]);
  EXPECT_GT(output_error[1], output_error[0]);
}

// Sequential GPTQ (session 14): layer 0's q, k and v see the unquantized model's inputs, so they
// come out as apply_gptq makes them from one calibration; every later matrix is quantized too (from
// the quantized model's inputs), and each at most at its round-to-nearest error on those inputs.
TEST(Gptq, SequentialMatchesOneCalibrationWhereNothingIsQuantizedYet) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  ModelWeights once = random_weights(c, 13, 0.5f), seq = random_weights(c, 13, 0.5f);
  const std::vector<int32_t> tokens = test::calibration_tokens();
  quant::apply_gptq(once, quant::calibrate(c, once, pool, tokens, 32, 128), pool, 32, nullptr);
  int matrices = 0;
  quant::apply_gptq_sequential(c, seq, pool, tokens, 32, 32, [&](const quant::GptqReport& r) {
    ++matrices;
    EXPECT_LE(r.error, r.error_rtn * (1.0 + 1e-6)) << "layer " << r.layer << " " << r.matrix;
  });
  EXPECT_EQ(matrices, 7 * c.n_layers);
  ASSERT_EQ(seq.layers.size(), once.layers.size());
  for (auto member : {&LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv}) {
    const QuantizedMatrix& a = (once.layers[0].*member).quant;
    const QuantizedMatrix& b = (seq.layers[0].*member).quant;
    // The same H up to the fp32 order of its sums (one product a window either way): equal codes
    // but for rare rounding ties.
    ASSERT_EQ(a.q.size(), b.q.size());
    EXPECT_GE(share_of_equal_code_bytes(a, b), 0.99);
  }
  for (const LayerWeights& l : seq.layers) {
    EXPECT_EQ(l.wo.quant.format, QuantFormat::int4);
    EXPECT_EQ(l.w_down.quant.format, QuantFormat::int4);
  }
  // Later layers differ: their inputs came through quantized matrices.
  EXPECT_NE(once.layers.back().w_down.quant.q, seq.layers.back().w_down.quant.q);
}

// The Hessians summed as rows pass (calibrate's hessian_rows) are those of the rows kept with
// max_samples = hessian_rows, to fp32 rounding within a window; with fewer rows than tokens the
// same evenly spaced rows are taken.
TEST(Gptq, HessiansSummedDuringCalibrationMatchTheKeptRows) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  const ModelWeights w = random_weights(c, 21, 0.5f);
  std::vector<int32_t> tokens(160);
  for (int i = 0; i < 160; ++i) tokens[size_t(i)] = (i * 31 + 7) % 97;
  for (int64_t rows : {int64_t(160), int64_t(40)}) {
    const quant::Calibration kept = quant::calibrate(c, w, pool, tokens, 32, rows);
    const quant::Calibration summed = quant::calibrate(c, w, pool, tokens, 32, 0, rows);
    for (size_t l = 0; l < kept.layers.size(); ++l)
      for (size_t site = 0; site < 4; ++site) {
        const quant::SiteStats& a = kept.layers[l][site];
        const quant::SiteStats& b = summed.layers[l][site];
        ASSERT_EQ(b.n_samples, 0);
        ASSERT_EQ(b.hessian_rows, a.n_samples) << "rows " << rows;
        const std::vector<double> Ha = quant::input_hessian(a, pool), Hb = quant::input_hessian(b, pool);
        ASSERT_EQ(Ha.size(), Hb.size());
        double worst = 0, scale = 0;
        for (size_t i = 0; i < Ha.size(); ++i) {
          worst = std::max(worst, std::fabs(Ha[i] - Hb[i]));
          scale = std::max(scale, std::fabs(Ha[i]));
        }
        EXPECT_GT(scale, 0.0);
        EXPECT_LE(worst, 1e-5 * scale) << "layer " << l << " site " << site << " rows " << rows;
      }
  }
}

TEST(Gptq, ActOrderSortsByInputEnergyAndPermutesTheHessian) {
  const int64_t n = 5;
  std::vector<double> H(size_t(n * n));
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) H[size_t(a * n + b)] = a == b ? double((a * 3) % 5) + 1.0 : double(10 * a + b);
  const std::vector<int64_t> order = quant::gptq_act_order(H, n);  // diag: 1, 4, 2, 5, 3
  EXPECT_EQ(order, (std::vector<int64_t>{3, 1, 4, 2, 0}));
  const std::vector<double> P = quant::permuted_hessian(H, order);
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) EXPECT_EQ(P[size_t(a * n + b)], H[size_t(order[size_t(a)] * n + order[size_t(b)])]);
}

TEST(Gptq, MseGridIsNeverWorseOnItsLoss) {
  std::mt19937 rng(21);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> v(128), lw(128);
    for (float& x : v) x = g(rng) * (trial % 5 == 0 ? 3.0f : 1.0f);
    v[size_t(trial % 128)] = 8.0f;  // an outlier: shrinking the range pays
    for (float& x : lw) x = 0.5f + std::fabs(g(rng));
    auto loss = [&](const quant::Int4Grid& grid) {
      double e = 0;
      for (size_t k = 0; k < v.size(); ++k) {
        const double d = double(v[k]) - grid.value(grid.code(v[k]));
        e += double(lw[k]) * d * d;
      }
      return e;
    };
    const quant::Int4Grid full = quant::gptq_group_grid(v.data(), lw.data(), 128, false);
    const quant::Int4Grid mse = quant::gptq_group_grid(v.data(), lw.data(), 128, true);
    EXPECT_EQ(full.min, quant::int4_grid(v.data(), 128).min);
    EXPECT_LE(loss(mse), loss(full));
  }
}

TEST(Gptq, ActOrderAndMseGridStillBeatRoundToNearest) {
  ThreadPool pool(2);
  const int64_t rows = 24, cols = 128, group = 32;
  const quant::SiteStats s = correlated_inputs(1024, cols, 7);
  const std::vector<double> H = quant::input_hessian(s, pool);
  const std::vector<float> w = random_matrix(rows, cols, 9);
  const double e_rtn = quant::hessian_error(w.data(), quant::quantize_int4(w.data(), rows, cols, group), H, pool);
  for (bool act_order : {false, true})
    for (bool mse : {false, true}) {
      quant::GptqOptions opt;
      opt.mse_grid = mse;
      if (act_order) opt.order = quant::gptq_act_order(H, cols);
      const std::vector<float> U =
          act_order ? quant::gptq_inverse_factor(quant::permuted_hessian(H, opt.order), cols) : quant::gptq_inverse_factor(H, cols);
      const QuantizedMatrix q = quant::gptq_int4(w.data(), rows, cols, group, U, pool, opt);
      quant::validate(q, "gptq");
      const double e = quant::hessian_error(w.data(), q, H, pool);
      EXPECT_LT(e, 0.8 * e_rtn) << "act_order " << act_order << " mse " << mse << ": " << e << " vs rtn " << e_rtn;
    }
}

TEST(Gptq, RefitRecoversTheGridsOfCodesThatFitExactly) {
  ThreadPool pool(2);
  const int64_t rows = 6, cols = 128, group = 32;
  const std::vector<double> H = quant::input_hessian(correlated_inputs(1024, cols, 3), pool);
  // w on a known grid: random codes, random positive scales and mins.
  QuantizedMatrix truth = QuantizedMatrix::zeroed(QuantFormat::int4, rows, cols, group);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (int64_t i = 0; i < rows * cols; ++i) quant::set_int4_code(truth, i, float(code(rng)));
  for (size_t g = 0; g < truth.scales.size(); ++g) truth.scales[g] = 0.01f * u(rng), truth.mins[g] = -0.08f * u(rng);
  std::vector<float> w(size_t(rows * cols));
  quant::dequantize(truth, w.data());
  QuantizedMatrix q = truth;  // the same codes, the grids disturbed
  for (size_t g = 0; g < q.scales.size(); ++g) q.scales[g] *= 1.1f, q.mins[g] += 0.01f;
  const double disturbed = quant::hessian_error(w.data(), q, H, pool);
  EXPECT_EQ(quant::refit_int4_grids(w.data(), q, H, pool), rows);
  for (size_t g = 0; g < q.scales.size(); ++g) {
    EXPECT_NEAR(q.scales[g], truth.scales[g], 1e-4 * truth.scales[g]) << g;
    EXPECT_NEAR(q.mins[g], truth.mins[g], 1e-4 * std::fabs(truth.mins[g])) << g;
  }
  EXPECT_LT(quant::hessian_error(w.data(), q, H, pool), 1e-6 * disturbed);  // fp32 grids: not exactly 0
}

TEST(Gptq, RefitLowersGptqsOutputErrorAndNeverRaisesIt) {
  ThreadPool pool(2);
  const int64_t rows = 24, cols = 128, group = 32;
  const std::vector<double> H = quant::input_hessian(correlated_inputs(1024, cols, 7), pool);
  const std::vector<float> w = random_matrix(rows, cols, 9);
  quant::GptqOptions opt;
  opt.mse_grid = true;
  opt.order = quant::gptq_act_order(H, cols);
  const std::vector<float> U = quant::gptq_inverse_factor(quant::permuted_hessian(H, opt.order), cols);
  const QuantizedMatrix before = quant::gptq_int4(w.data(), rows, cols, group, U, pool, opt);
  QuantizedMatrix after = before;
  EXPECT_GT(quant::refit_int4_grids(w.data(), after, H, pool), 0);
  EXPECT_EQ(after.q, before.q);  // the codes stay
  quant::validate(after, "refit");
  for (int64_t r = 0; r < rows; ++r) {  // row by row: each row's error at most what it was
    auto row = [&](const QuantizedMatrix& m) {
      QuantizedMatrix one = QuantizedMatrix::zeroed(QuantFormat::int4, 1, cols, group);
      std::copy_n(m.q.begin() + r * cols / 2, cols / 2, one.q.begin());
      std::copy_n(m.scales.begin() + r * (cols / group), cols / group, one.scales.begin());
      std::copy_n(m.mins.begin() + r * (cols / group), cols / group, one.mins.begin());
      return quant::hessian_error(w.data() + r * cols, one, H, pool);
    };
    EXPECT_LE(row(after), row(before) * (1 + 1e-9)) << "row " << r;
  }
  const double e0 = quant::hessian_error(w.data(), before, H, pool);
  const double e1 = quant::hessian_error(w.data(), after, H, pool);
  EXPECT_LT(e1, 0.95 * e0) << "refit " << e1 << " vs gptq " << e0;
  // A second GPTQ pass on the refit grids, then a refit again: still below GPTQ's first error.
  const std::vector<quant::Int4Grid> grids = quant::int4_grids_of(after);
  quant::GptqOptions again = opt;
  again.grids = &grids;
  QuantizedMatrix twice = quant::gptq_int4(w.data(), rows, cols, group, U, pool, again);
  quant::refit_int4_grids(w.data(), twice, H, pool);
  EXPECT_LT(quant::hessian_error(w.data(), twice, H, pool), e0);
}

// Asymmetric sequential GPTQ (session 20): layer 0's q, k and v see the same inputs in both models,
// so the map is the identity and they come out as the symmetric form makes them; later matrices fit
// a different target (the unquantized model's outputs) and differ.
TEST(Gptq, AsymmetricMatchesSequentialWhereNothingIsQuantizedYet) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  ModelWeights seq = random_weights(c, 13, 0.5f), asym = random_weights(c, 13, 0.5f);
  const std::vector<int32_t> tokens = test::calibration_tokens();
  quant::apply_gptq_sequential(c, seq, pool, tokens, 32, 32, nullptr);
  quant::GptqOptions opt;
  opt.asymmetric = true;
  int matrices = 0;
  quant::apply_gptq_sequential(c, asym, pool, tokens, 32, 32, [&](const quant::GptqReport&) { ++matrices; }, opt);
  EXPECT_EQ(matrices, 7 * c.n_layers);
  for (auto member : {&LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv}) {
    const QuantizedMatrix& a = (seq.layers[0].*member).quant;
    const QuantizedMatrix& b = (asym.layers[0].*member).quant;
    ASSERT_EQ(a.q.size(), b.q.size());
    EXPECT_GE(share_of_equal_code_bytes(a, b), 0.99);
  }
  EXPECT_EQ(asym.layers.back().w_down.quant.format, QuantFormat::int4);
  EXPECT_NE(seq.layers.back().w_down.quant.q, asym.layers.back().w_down.quant.q);
}

// Under a diagonal H the error is a sum over columns, each minimized by its nearest code: a sweep
// from round-to-nearest has nothing to move.
TEST(Gptq, DescentLeavesRoundToNearestUnderADiagonalHessian) {
  ThreadPool pool(2);
  const int64_t rows = 8, cols = 64, group = 32;
  std::vector<double> H(size_t(cols * cols), 0.0);
  for (int64_t i = 0; i < cols; ++i) H[size_t(i * cols + i)] = 1.0 + double(i % 5);
  const std::vector<float> w = random_matrix(rows, cols, 5);
  QuantizedMatrix q = quant::quantize_int4(w.data(), rows, cols, group);
  const QuantizedMatrix rtn = q;
  const quant::Int4DescentResult res = quant::int4_coordinate_descent(w.data(), q, H, 4, pool);
  EXPECT_EQ(res.moves, 0);
  EXPECT_EQ(res.sweeps, 1);
  EXPECT_EQ(q.q, rtn.q);
}

// From round-to-nearest on correlated inputs the descent takes most of the output error away
// (1794 -> 149 here; GPTQ reaches 74, and the descent after GPTQ 73: one code at a time cannot make
// the joint moves GPTQ's error feedback makes), row by row never raising it, grids untouched.
TEST(Gptq, DescentLowersTheOutputErrorAndNeverRaisesIt) {
  ThreadPool pool(2);
  const int64_t rows = 24, cols = 128, group = 32;
  const std::vector<double> H = quant::input_hessian(correlated_inputs(1024, cols, 7), pool);
  const std::vector<float> w = random_matrix(rows, cols, 9);
  const QuantizedMatrix before = quant::quantize_int4(w.data(), rows, cols, group);
  QuantizedMatrix after = before;
  const quant::Int4DescentResult res = quant::int4_coordinate_descent(w.data(), after, H, 32, pool);
  EXPECT_GT(res.moves, 0);
  EXPECT_LT(res.sweeps, 32);  // converged: a last sweep moved nothing
  EXPECT_EQ(after.scales, before.scales);
  EXPECT_EQ(after.mins, before.mins);
  quant::validate(after, "descent");
  const std::vector<double> e0 = quant::hessian_row_errors(w.data(), before, H, pool);
  const std::vector<double> e1 = quant::hessian_row_errors(w.data(), after, H, pool);
  double s0 = 0, s1 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_LE(e1[size_t(r)], e0[size_t(r)] * (1 + 1e-9)) << "row " << r;
    s0 += e0[size_t(r)];
    s1 += e1[size_t(r)];
  }
  EXPECT_LT(s1, 0.2 * s0) << "descent " << s1 << " vs round to nearest " << s0;
  // Converged: a second call finds no move.
  EXPECT_EQ(quant::int4_coordinate_descent(w.data(), after, H, 32, pool).moves, 0);
}

}  // namespace
}  // namespace kiln
