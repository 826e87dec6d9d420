// argmax and top-k/top-p sampling against host references with the same uniform draw.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/sampling.h"

namespace kiln::gputest {
namespace {

int32_t host_sample(const float* row, int64_t vocab, cuda::SampleParams p, int64_t r) {
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  int64_t k = (p.top_k <= 0 || p.top_k > cuda::kSampleMaxK) ? cuda::kSampleMaxK : p.top_k;
  k = std::min(k, vocab);
  float top = row[idx[0]], total = 0;
  for (int64_t i = 0; i < k; ++i) total += std::exp((row[idx[size_t(i)]] - top) * (1.0f / p.temperature));
  float kept = 0;
  int64_t n_keep = k;
  for (int64_t i = 0; i < k; ++i) {
    kept += std::exp((row[idx[size_t(i)]] - top) * (1.0f / p.temperature));
    if (kept >= p.top_p * total) {
      n_keep = i + 1;
      break;
    }
  }
  float target = cuda::sample_uniform(p.seed, r) * kept, acc = 0;
  for (int64_t i = 0; i < n_keep; ++i) {
    acc += std::exp((row[idx[size_t(i)]] - top) * (1.0f / p.temperature));
    if (acc > target) return idx[size_t(i)];
  }
  return idx[size_t(n_keep - 1)];
}

TEST(GpuSampling, ArgmaxMatchesHostWithTies) {
  KILN_REQUIRE_GPU();
  const int64_t rows = 3, vocab = 128256;
  auto logits = random_bf16_values(size_t(rows * vocab), 17, 5.0f);
  logits[size_t(vocab + 500)] = 9.0f;  // a tie in row 1: the lower id wins
  logits[size_t(vocab + 90000)] = 9.0f;
  DeviceBuffer<float> d(logits);
  DeviceBuffer<int32_t> out(rows);
  out.poison();
  cuda::argmax(d.data(), rows, vocab, out.data(), nullptr);
  auto got = out.to_host();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    EXPECT_EQ(got[size_t(r)], int32_t(std::max_element(row, row + vocab) - row)) << "row " << r;
  }
}

TEST(GpuSampling, TopKTopPMatchesHostReference) {
  KILN_REQUIRE_GPU();
  const int64_t rows = 7, vocab = 5003;
  // Distinct logits (a permutation of a grid) so that the order, hence the choice, is unambiguous.
  std::vector<float> logits(size_t(rows * vocab));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < vocab; ++i) logits[size_t(r * vocab + i)] = float((i * 7919 + r * 31) % vocab) * 0.003f;
  DeviceBuffer<float> d(logits);
  DeviceBuffer<int32_t> out(rows);
  for (cuda::SampleParams p : {cuda::SampleParams{1.0f, 40, 0.9f, 1}, cuda::SampleParams{0.7f, 0, 0.95f, 2},
                               cuda::SampleParams{1.3f, 1, 1.0f, 3}, cuda::SampleParams{1.0f, 2000, 1.0f, 4}}) {
    out.poison();
    cuda::sample_top_k_top_p(d.data(), rows, vocab, p, out.data(), nullptr);
    auto got = out.to_host();
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(got[size_t(r)], host_sample(logits.data() + r * vocab, vocab, p, r))
          << "row " << r << " k " << p.top_k << " p " << p.top_p;
  }
}

// Heavy ties (6 distinct values over the whole row): the cut falls inside a tie, which must go to
// the lowest ids (the host's stable sort). The old bisection never finished on any input.
TEST(GpuSampling, TopKTopPHeavyTies) {
  KILN_REQUIRE_GPU();
  for (int64_t vocab : {int64_t(5003), int64_t(37), int64_t(1024), int64_t(3000)}) {
    const int64_t rows = 5;
    std::vector<float> logits(size_t(rows * vocab));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < vocab; ++i)
        logits[size_t(r * vocab + i)] = r == 4 ? 1.5f : float(((i * 7919 + r * 31) % vocab) % 6) * 0.5f;
    DeviceBuffer<float> d(logits);
    DeviceBuffer<int32_t> out(rows);
    for (cuda::SampleParams p : {cuda::SampleParams{1.0f, 40, 0.9f, 1}, cuda::SampleParams{0.7f, 0, 0.95f, 2},
                                 cuda::SampleParams{1.3f, 1, 1.0f, 3}, cuda::SampleParams{1.0f, 2000, 1.0f, 4},
                                 cuda::SampleParams{1.0f, 100000, 0.5f, 5}, cuda::SampleParams{2.0f, 3, 0.0f, 6}}) {
      out.poison();
      cuda::sample_top_k_top_p(d.data(), rows, vocab, p, out.data(), nullptr);
      auto got = out.to_host();
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_EQ(got[size_t(r)], host_sample(logits.data() + r * vocab, vocab, p, r))
            << "vocab " << vocab << " row " << r << " k " << p.top_k << " p " << p.top_p;
    }
  }
}

// NaN, -inf and +inf logits: the kernel must finish and pick a valid, non-NaN id.
TEST(GpuSampling, TopKTopPNonFiniteLogits) {
  KILN_REQUIRE_GPU();
  const int64_t rows = 5, vocab = 2053;
  std::vector<float> logits(size_t(rows * vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    logits[size_t(0 * vocab + i)] = std::nanf("");                            // all NaN
    logits[size_t(1 * vocab + i)] = -INFINITY;                                // all -inf
    logits[size_t(2 * vocab + i)] = i % 3 == 0 ? std::nanf("") : -INFINITY;   // NaN and -inf
    logits[size_t(3 * vocab + i)] = i % 2 ? std::nanf("") : float(i % 7);     // half NaN
    logits[size_t(4 * vocab + i)] = i == 1234 ? INFINITY : float(i % 5);      // one +inf
  }
  DeviceBuffer<float> d(logits);
  DeviceBuffer<int32_t> out(rows);
  for (cuda::SampleParams p : {cuda::SampleParams{1.0f, 40, 0.9f, 1}, cuda::SampleParams{1.0f, 0, 1.0f, 2},
                               cuda::SampleParams{0.5f, 5000, 0.3f, 3}}) {
    out.poison();
    cuda::sample_top_k_top_p(d.data(), rows, vocab, p, out.data(), nullptr);
    auto got = out.to_host();
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_GE(got[size_t(r)], 0) << "row " << r;
      ASSERT_LT(got[size_t(r)], vocab) << "row " << r;
      if (r >= 1) {
        EXPECT_FALSE(std::isnan(logits[size_t(r * vocab + got[size_t(r)])])) << "row " << r;
      }
    }
    EXPECT_EQ(got[4], 1234);
  }
}

}  // namespace
}  // namespace kiln::gputest
