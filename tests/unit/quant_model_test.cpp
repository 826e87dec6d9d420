// Quantization on a whole (tiny) model: the AWQ folds keep the function, the CPU's W8A8 and KV
// cache formats change the logits a little and only where they should, the KL numbers of
// `kiln perplexity`, and backends refusing KV formats they cannot store.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "expect_error.h"
#include "quant/awq.h"
#include "quant/calibration.h"
#include "quant/kl_divergence.h"
#include "quant/quantize.h"
#include "quant/quantize_model.h"
#include "tiny_model.h"

namespace kiln {
namespace {

std::vector<int32_t> some_tokens(int n, int seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = (i * 37 + seed * 11 + 5) % 97;
  return t;
}

using test::all_logits;
using test::max_abs;
using test::max_abs_diff;

TEST(Awq, FoldsKeepTheFunctionAndTheSearchNeverLosesToRoundToNearest) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  ModelWeights w = random_weights(c, 11, 0.5f);
  const std::vector<int32_t> calib = some_tokens(96, 1), probe = some_tokens(24, 2);
  const std::vector<float> before = all_logits(*std::make_unique<CpuBackend>(c, w, pool), probe);

  quant::Calibration cal = quant::calibrate(c, w, pool, calib, 32, 48);
  ASSERT_EQ(cal.layers.size(), size_t(c.n_layers));
  EXPECT_EQ(cal.tokens, 96);
  EXPECT_EQ(cal.layers[0][size_t(LinearSite::mlp_act)].cols, c.intermediate_size);
  EXPECT_EQ(cal.layers[1][size_t(LinearSite::attn_in)].n_samples, 48);

  int choices = 0;
  ModelWeights scaled = w;
  quant::apply_awq(scaled, c, cal, pool, 128, /*clip=*/false, [&](const quant::AwqChoice& ch) {
    ++choices;
    EXPECT_LE(ch.error, ch.error_rtn) << ch.layer << " " << ch.group;
    EXPECT_GE(ch.alpha, 0.0f);
    EXPECT_LE(ch.alpha, 1.0f);
  });
  EXPECT_EQ(choices, 4 * c.n_layers);
  // Unquantized, the scaled model computes the same function (folds are exact up to rounding).
  const std::vector<float> after = all_logits(*std::make_unique<CpuBackend>(c, scaled, pool), probe);
  EXPECT_LT(max_abs_diff(before, after), 1e-4 * max_abs(before));
}

// The clipping search (AWQ's auto_clip): per site the clipped objective is never above the
// unclipped one (r = 1 is a candidate), q and k are untouched, some groups of the others are
// clipped (so their largest magnitudes shrink, never grow), and the int4 model's logits are no
// further from the unquantized model's than with the scales alone on these random weights.
TEST(Awq, ClippingNeverRaisesTheObjectiveAndLeavesQAndKAlone) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  const ModelWeights w = random_weights(c, 11, 0.5f);
  const std::vector<int32_t> calib = some_tokens(96, 1), probe = some_tokens(24, 2);
  quant::Calibration cal = quant::calibrate(c, w, pool, calib, 32, 48);
  ModelWeights scaled = w, clipped = w;
  quant::apply_awq(scaled, c, cal, pool, 32, false, nullptr);
  int sites = 0;
  quant::apply_awq(clipped, c, cal, pool, 32, true, [&](const quant::AwqChoice& ch) {
    ++sites;
    EXPECT_GT(ch.clip_error_before, 0.0) << ch.layer << " " << ch.group;
    EXPECT_LE(ch.clip_error_after, ch.clip_error_before) << ch.layer << " " << ch.group;
  });
  EXPECT_EQ(sites, 4 * c.n_layers);
  int64_t changed = 0;
  for (size_t l = 0; l < clipped.layers.size(); ++l) {
    const LayerWeights &a = scaled.layers[l], &b = clipped.layers[l];
    EXPECT_EQ(a.wq.data, b.wq.data);
    EXPECT_EQ(a.wk.data, b.wk.data);
    for (auto [x, y] : {std::pair{&a.wv, &b.wv}, std::pair{&a.wo, &b.wo}, std::pair{&a.w_gate, &b.w_gate},
                        std::pair{&a.w_up, &b.w_up}, std::pair{&a.w_down, &b.w_down}})
      for (size_t i = 0; i < x->data.size(); ++i) {
        EXPECT_LE(std::fabs(y->data[i]), std::fabs(x->data[i]));
        changed += y->data[i] != x->data[i];
      }
  }
  EXPECT_GT(changed, 0);
}

TEST(QuantizedModel, Int8AndInt4StayCloseAndFp8QuantizesActivations) {
  ThreadPool pool(2);
  const ModelConfig c = test::tiny_config();
  const ModelWeights w = random_weights(c, 12, 0.1f);  // small weights: errors stay in the linear regime
  const std::vector<int32_t> probe = some_tokens(20, 3);
  const std::vector<float> ref = all_logits(*std::make_unique<CpuBackend>(c, w, pool), probe);
  double err[3];
  int i = 0;
  for (quant::TargetType t : {quant::TargetType::int8, quant::TargetType::int4, quant::TargetType::fp8}) {
    ModelWeights q = w;
    for (auto& L : q.layers)
      for (HostMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) quant::quantize_matrix(*m, t);
    EXPECT_EQ(q.layers[0].wq.quant.format,
              t == quant::TargetType::int8 ? QuantFormat::int8
              : t == quant::TargetType::int4 ? QuantFormat::int4 : QuantFormat::fp8);
    const std::vector<float> got = all_logits(*std::make_unique<CpuBackend>(c, q, pool), probe);
    err[i++] = max_abs_diff(ref, got) / max_abs(ref);
    if (t == quant::TargetType::fp8) {
      // The same dequantized weights without the fp8 tag: no activation quantization, other logits.
      for (auto& L : q.layers)
        for (HostMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) m->quant = {};
      const std::vector<float> w8a16 = all_logits(*std::make_unique<CpuBackend>(c, q, pool), probe);
      EXPECT_GT(max_abs_diff(w8a16, got), 0.0);
      EXPECT_LT(max_abs_diff(w8a16, got), 0.1 * max_abs(ref));
    }
  }
  EXPECT_LT(err[0], 0.01);  // int8
  EXPECT_LT(err[1], 0.3);   // int4 (random weights have no structure: 4 bits are coarse)
  EXPECT_LT(err[2], 0.1);   // fp8 W8A8
  EXPECT_LT(err[0], err[1]);
}

TEST(KvCacheFormat, QuantizedCachesPerturbTheLogitsSlightlyAndBatchAlike) {
  ThreadPool pool(2);
  const std::vector<int32_t> probe = some_tokens(40, 4);
  const ModelConfig c = test::tiny_config();
  const ModelWeights w = random_weights(c, 13, 0.1f);
  const std::vector<float> ref = all_logits(*std::make_unique<CpuBackend>(c, w, pool), probe);
  for (KvCacheFormat f : {KvCacheFormat::bf16, KvCacheFormat::int8, KvCacheFormat::fp8}) {
    SCOPED_TRACE(std::string(kv_cache_format_name(f)));
    auto b = std::make_unique<CpuBackend>(c, w, pool);
    b->set_kv_cache_format(f);
    EXPECT_EQ(b->kv_cache_format(), f);
    const std::vector<float> got = all_logits(*b, probe);
    const double rel = max_abs_diff(ref, got) / max_abs(ref);
    EXPECT_GT(rel, 0.0);
    EXPECT_LT(rel, f == KvCacheFormat::fp8 ? 0.1 : 0.02);
    // Token by token (decode) gives what one prefill gives: the cache quantizes each token alone.
    auto seq = b->new_sequence(int64_t(probe.size()));
    std::vector<float> step;
    for (size_t t = 0; t < probe.size(); ++t) {
      b->forward(*seq, std::span<const int32_t>(&probe[t], 1), false, step);
      const size_t vocab = step.size();
      for (size_t v = 0; v < vocab; ++v) ASSERT_NEAR(step[v], got[t * vocab + v], 1e-4f) << t;
    }
  }
}

TEST(KvCacheFormat, ParsesNamesAndBackendsRefuseWhatTheyCannotStore) {
  EXPECT_EQ(parse_kv_cache_format("int8"), KvCacheFormat::int8);
  EXPECT_EQ(parse_kv_cache_format("fp8"), KvCacheFormat::fp8);
  EXPECT_EQ(parse_kv_cache_format("bf16"), KvCacheFormat::bf16);
  test::expect_error([] { parse_kv_cache_format("int4"); }, "--kv-cache must be bf16, int8 or fp8, got 'int4'",
                     Errc::invalid_argument);
  // A backend that keeps the default: only its native cache.
  struct NativeOnly final : Backend {
    ModelConfig c = test::tiny_config();
    std::string name() const override { return "cuda"; }
    const ModelConfig& config() const override { return c; }
    std::unique_ptr<KvSequence> new_sequence(int64_t) override { return nullptr; }
    void forward_impl(KvSequence&, std::span<const int32_t>, bool, std::vector<float>&) override {}
  } b;
  EXPECT_NO_THROW(b.set_kv_cache_format(KvCacheFormat::native));
  test::expect_error([&] { b.set_kv_cache_format(KvCacheFormat::int8); }, "a int8 KV cache is not supported on cuda yet",
                     Errc::unsupported);
}

TEST(KlDivergence, OfKnownDistributions) {
  // p = (0.5, 0.5) as the base, q = (0.9, 0.1): KL(p || q) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1).
  const std::vector<double> p = {std::log(0.5), std::log(0.5)}, q = {std::log(0.9), std::log(0.1)};
  const quant::LogProbRecord base = quant::LogProbRecord::encode(p);
  const quant::TokenComparison cmp = quant::compare(base, q);
  EXPECT_NEAR(cmp.kl, 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(0.5 / 0.1), 1e-4);
  EXPECT_TRUE(cmp.same_top1);  // tie in the base: its first index, as q's top
  // A distribution against itself: ~0, same top-1, through the bytes on disk.
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i) * 0.37f) * 6.0f;
  std::vector<double> lp;
  quant::log_softmax(logits, lp);
  double total = 0;
  for (double v : lp) total += std::exp(v);
  EXPECT_NEAR(total, 1.0, 1e-12);
  std::vector<uint8_t> bytes(quant::LogProbRecord::bytes(lp.size()));
  quant::LogProbRecord::encode(lp).write_to(bytes.data());
  const quant::TokenComparison self = quant::compare(quant::LogProbRecord::read_from(bytes.data(), lp.size()), lp);
  EXPECT_LT(self.kl, 1e-6);
  EXPECT_TRUE(self.same_top1);
  std::vector<double> shifted = lp;
  std::swap(shifted[0], shifted[size_t(std::max_element(lp.begin(), lp.end()) - lp.begin())]);
  EXPECT_FALSE(quant::compare(quant::LogProbRecord::read_from(bytes.data(), lp.size()), shifted).same_top1);
}

}  // namespace
}  // namespace kiln
