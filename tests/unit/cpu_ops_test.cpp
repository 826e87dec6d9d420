// Properties of the CPU reference operators that do not need another implementation to check.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"

namespace kiln {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(CpuOps, MatmulMatchesNaiveDoubleLoop) {
  ThreadPool pool(2);
  const int64_t m = 3, n = 37, k = 69;  // not multiples of anything
  auto x = random_vector(size_t(m * k), 1), w = random_vector(size_t(n * k), 2), b = random_vector(size_t(n), 3);
  std::vector<float> y(size_t(m * n));
  cpu::matmul(pool, x.data(), w.data(), b.data(), y.data(), m, n, k);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = b[size_t(j)];
      for (int64_t kk = 0; kk < k; ++kk) ref += double(x[size_t(i * k + kk)]) * w[size_t(j * k + kk)];
      EXPECT_NEAR(y[size_t(i * n + j)], ref, 1e-4);
    }
}

TEST(CpuOps, RmsnormGivesUnitRms) {
  auto x = random_vector(96, 4);
  std::vector<float> w(96, 1.0f), out(96);
  cpu::rmsnorm(x.data(), w.data(), out.data(), 1, 96, 1e-6f);
  double ss = 0;
  for (float v : out) ss += double(v) * v;
  EXPECT_NEAR(std::sqrt(ss / 96), 1.0, 1e-5);
}

TEST(CpuOps, RopeAtPositionZeroIsIdentityAndPreservesNorm) {
  RopeConfig rope;
  rope.theta = 10000;
  rope.rot_dim = 64;
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half}) {
    rope.style = style;
    auto x = random_vector(2 * 3 * 64, 5);
    auto y = x;
    int32_t pos[2] = {0, 1234};
    cpu::rope(y.data(), pos, 2, 3, 64, rope);
    for (int i = 0; i < 3 * 64; ++i) EXPECT_FLOAT_EQ(y[size_t(i)], x[size_t(i)]);
    double nx = 0, ny = 0;
    for (int i = 3 * 64; i < 6 * 64; ++i) nx += double(x[size_t(i)]) * x[size_t(i)], ny += double(y[size_t(i)]) * y[size_t(i)];
    EXPECT_NEAR(nx, ny, 1e-3 * nx);
  }
}

TEST(CpuOps, RopeStylesAgreeUnderThePermutation) {
  // GGUF's interleaved layout is HF's half layout with rows permuted: element 2i <-> i, 2i+1 <-> i+d/2.
  RopeConfig rope;
  rope.rot_dim = 8;
  auto half_x = random_vector(8, 6);
  std::vector<float> inter_x(8);
  for (int i = 0; i < 4; ++i) inter_x[2 * i] = half_x[i], inter_x[2 * i + 1] = half_x[i + 4];
  int32_t pos = 17;
  rope.style = RopeStyle::half;
  cpu::rope(half_x.data(), &pos, 1, 1, 8, rope);
  rope.style = RopeStyle::interleaved;
  cpu::rope(inter_x.data(), &pos, 1, 1, 8, rope);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(inter_x[2 * i], half_x[i], 1e-6);
    EXPECT_NEAR(inter_x[2 * i + 1], half_x[i + 4], 1e-6);
  }
}

TEST(CpuOps, Llama3RopeScalingKeepsHighFrequenciesAndSlowsLowOnes) {
  RopeConfig plain;
  plain.theta = 500000;
  plain.rot_dim = 128;
  RopeConfig scaled = plain;
  scaled.llama3_factor = 8;
  scaled.llama3_low_freq_factor = 1;
  scaled.llama3_high_freq_factor = 4;
  scaled.llama3_original_context = 8192;
  EXPECT_FLOAT_EQ(cpu::rope_inv_freq(scaled, 0), cpu::rope_inv_freq(plain, 0));
  EXPECT_NEAR(cpu::rope_inv_freq(scaled, 63), cpu::rope_inv_freq(plain, 63) / 8, 1e-12);
}

TEST(CpuOps, AttentionWithOneKeyReturnsItsValue) {
  // The first query sees only position 0, so its output is v[0] for every head of the group.
  const int64_t heads = 4, kv_heads = 2, d = 8;
  auto q = random_vector(size_t(2 * heads * d), 7), k = random_vector(size_t(2 * kv_heads * d), 8),
       v = random_vector(size_t(2 * kv_heads * d), 9);
  std::vector<float> out(q.size());
  cpu::attention(q.data(), k.data(), v.data(), out.data(), 2, 0, heads, kv_heads, d);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < d; ++i) EXPECT_FLOAT_EQ(out[size_t(h * d + i)], v[size_t((h / 2) * d + i)]);
}

TEST(CpuOps, SiluMul) {
  float g[3] = {0.0f, 1.0f, -2.0f}, u[3] = {5.0f, 2.0f, 1.0f}, o[3];
  cpu::silu_mul(g, u, o, 3);
  EXPECT_FLOAT_EQ(o[0], 0.0f);
  EXPECT_NEAR(o[1], 2.0f / (1.0f + std::exp(-1.0f)), 1e-6);
  EXPECT_NEAR(o[2], -2.0f / (1.0f + std::exp(2.0f)), 1e-6);
}

}  // namespace
}  // namespace kiln
