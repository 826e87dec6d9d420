// kiln's CPU forward pass against an independent float64 NumPy implementation of the same model
// (python/make_reference_logits.py, weights dequantized by the `gguf` package). Both compute the
// same function, so the only difference is kiln's fp32 rounding: measured 3.6e-5 on logits of
// magnitude up to ~27 (2026-11-30). 1e-3 leaves room for other compilers and thread counts while
// any real error (a wrong RoPE pair, a missing bias, a transposed weight) is orders larger.
#include <gtest/gtest.h>

#include "golden_model.h"

namespace kiln {
namespace {

constexpr double kTolerance = 1e-3;

TEST(NumpyReference, LogitsMatchFloat64Forward) {
  KILN_REQUIRE_MODEL(test::default_model_path());
  auto& backend = *test::golden_model()->backend;
  const size_t vocab = size_t(backend.config().vocab_size);
  const auto fixture = test::load_golden_fixture("smollm2_numpy_fp64.json");
  double worst = 0;
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto ids = c["ids"].get<std::vector<int32_t>>();
    std::vector<float> logits = test::all_logits(backend, ids);
    for (size_t t = 0; t < ids.size(); ++t) {
      auto probe = c["probe_ids"][t].get<std::vector<int32_t>>();
      auto expected = c["probe_logits"][t].get<std::vector<double>>();
      for (size_t k = 0; k < probe.size(); ++k)
        worst = std::max(worst, std::fabs(double(logits[t * vocab + size_t(probe[k])]) - expected[k]));
    }
  }
  std::printf("max |kiln - fp64| = %.2e\n", worst);
  EXPECT_LE(worst, kTolerance);
}

}  // namespace
}  // namespace kiln
