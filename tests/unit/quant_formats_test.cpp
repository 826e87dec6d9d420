// kiln's quantizers (src/quant/quantize.h) and the fp8 E4M3 conversion, against known values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "kiln/error.h"
#include "quant/fp8_e4m3.h"
#include "quant/quantize.h"

namespace kiln::quant {
namespace {

std::vector<float> normal(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Known encodings, as __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) gives them (the cases
// were worked out from cuda_fp8.hpp's reference conversion: RNE, saturation, subnormals, NaN).
TEST(Fp8E4M3, EncodesKnownValuesLikeCuda) {
  const float inf = std::numeric_limits<float>::infinity();
  const struct { float x; uint8_t q; } cases[] = {
      {0.0f, 0x00},         {-0.0f, 0x80},        {1.0f, 0x38},          {-2.0f, 0xc0},
      {0.5f, 0x30},         {448.0f, 0x7e},       {-448.0f, 0xfe},       {240.0f, 0x77},
      {449.0f, 0x7e},       {464.0f, 0x7e},       {465.0f, 0x7e},        {1e10f, 0x7e},
      {inf, 0x7e},          {-inf, 0xfe},         {0.1f, 0x1d},          {3.14159f, 0x45},
      {1.0625f, 0x38},      // tie between 1.0 and 1.125: to even
      {1.1875f, 0x3a},      // tie between 1.125 and 1.25: to even (1.25)
      {0.015625f, 0x08},    // 2^-6, smallest normal
      {0.013671875f, 0x07}, // 7/8 * 2^-6, largest subnormal
      {0.001953125f, 0x01}, // 2^-9, smallest subnormal
      {0.0009765625f, 0x00},// 2^-10: tie between 0 and 2^-9, to even (0)
      {0.00146484375f, 0x01},// 0.75 * 2^-9 rounds up
      {0.005859375f, 0x03},  // 3 * 2^-9 exactly
      {0.0048828125f, 0x02}, // 2.5 * 2^-9: tie, to even (2)
      {-0.0068359375f, 0x84},// -3.5 * 2^-9: tie, to even (4)
      {1e-30f, 0x00},       {-1e-30f, 0x80},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.x);
    EXPECT_EQ(f32_to_e4m3(c.x), c.q);
  }
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
}

TEST(Fp8E4M3, DecodesEveryByteAndRoundTrips) {
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  int finite = 0;
  for (int q = 0; q < 256; ++q) {
    const float v = e4m3_to_f32(uint8_t(q));
    if (std::isnan(v)) continue;
    ++finite;
    EXPECT_EQ(f32_to_e4m3(v), q == 0x80 ? 0x80 : q) << q;  // every finite byte encodes to itself
  }
  EXPECT_EQ(finite, 254);
}

TEST(Fp8E4M3, RoundsToTheNearestRepresentable) {
  std::vector<float> grid;
  for (int q = 0; q < 0x7f; ++q) grid.push_back(e4m3_to_f32(uint8_t(q)));
  for (float x : normal(5000, 3, 30.0f)) {
    const float ax = std::min(std::fabs(x), 448.0f), got = std::fabs(e4m3_to_f32(f32_to_e4m3(x)));
    float best = 1e30f;
    for (float g : grid) best = std::min(best, std::fabs(g - ax));
    EXPECT_EQ(std::fabs(got - ax), best) << x;
  }
}

TEST(QuantInt8, PerChannelSymmetric) {
  const int64_t rows = 5, cols = 40;
  std::vector<float> w = normal(size_t(rows * cols), 1);
  w[3] = 10.0f;  // row 0's amax
  QuantizedMatrix m = quantize_int8(w.data(), rows, cols);
  EXPECT_EQ(m.group_size, cols);
  ASSERT_EQ(m.scales.size(), size_t(rows));
  EXPECT_FLOAT_EQ(m.scales[0], 10.0f / 127.0f);
  EXPECT_EQ(int8_t(m.q[3]), 127);
  std::vector<float> back(w.size());
  dequantize(m, back.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_LE(std::fabs(back[size_t(r * cols + c)] - w[size_t(r * cols + c)]), m.scales[size_t(r)] * 0.5f + 1e-6f);
}

TEST(QuantInt4, GroupsSpanTheirMinToMax) {
  const int64_t rows = 3, cols = 256;
  std::vector<float> w = normal(size_t(rows * cols), 2);
  // Row 0, group 0: a Q4_1-like grid 0.3 + 0.1 q (q = c % 16), which int4 must reproduce exactly.
  for (int64_t c = 0; c < 128; ++c) w[size_t(c)] = 0.3f + 0.1f * float(c % 16);
  QuantizedMatrix m = quantize_int4(w.data(), rows, cols, 128);
  ASSERT_EQ(m.groups(), 2);
  ASSERT_EQ(m.q.size(), size_t(rows * cols / 2));
  EXPECT_EQ(m.mins[0], 0.3f);
  EXPECT_FLOAT_EQ(m.scales[0], (w[15] - 0.3f) / 15.0f);
  std::vector<float> back(w.size());
  dequantize(m, back.data());
  for (int64_t c = 0; c < 128; ++c) EXPECT_NEAR(back[size_t(c)], w[size_t(c)], 1e-6f) << c;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < 2; ++g) {
      const float scale = m.scales[size_t(r * 2 + g)], min = m.mins[size_t(r * 2 + g)];
      const float* x = w.data() + r * cols + g * 128;
      EXPECT_EQ(min, *std::min_element(x, x + 128));
      for (int64_t c = g * 128; c < (g + 1) * 128; ++c)
        EXPECT_LE(std::fabs(w[size_t(r * cols + c)] - back[size_t(r * cols + c)]), scale * 0.5f + 1e-5f) << r << "," << c;
    }
  // Nibble order: even column in the low nibble.
  const uint8_t b0 = m.q[0];
  EXPECT_EQ(back[0], float(b0 & 0xf) * m.scales[0] + m.mins[0]);
  EXPECT_EQ(back[1], float(b0 >> 4) * m.scales[0] + m.mins[0]);
  EXPECT_EQ(int4_group_for(576), 64);
  EXPECT_EQ(int4_group_for(1536), 128);
  EXPECT_EQ(int4_group_for(96), 32);
  EXPECT_EQ(int4_group_for(100), 0);
  EXPECT_EQ(int4_group_for(1536, 32), 32);
}

TEST(QuantFp8, PerChannelScaleIsAmaxOver448) {
  const int64_t rows = 4, cols = 64;
  std::vector<float> w = normal(size_t(rows * cols), 5);
  w[70] = -3.0f;  // row 1's amax
  QuantizedMatrix m = quantize_fp8(w.data(), rows, cols);
  EXPECT_FLOAT_EQ(m.scales[1], 3.0f / 448.0f);
  EXPECT_EQ(m.q[70], 0xfe);  // -448
  std::vector<float> back(w.size());
  dequantize(m, back.data());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_LE(std::fabs(back[i] - w[i]), std::fabs(w[i]) / 16 + 1e-3f) << i;
}

TEST(FakeQuantize, PerSegmentScales) {
  // Two segments: fp8 keeps each one's amax exactly and maps values onto its e4m3 grid.
  std::vector<float> x = {1.0f, -0.3f, 0.01f, 2.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  fake_quantize(QuantFormat::fp8, x.data(), 2, 4);
  EXPECT_FLOAT_EQ(x[3], 2.0f);
  const float scale = 2.0f / 448.0f;
  EXPECT_FLOAT_EQ(x[0], e4m3_to_f32(f32_to_e4m3(1.0f / scale)) * scale);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(x[i], 0.0f);  // zeros stay zeros, no NaN
  std::vector<float> y = {0.5f, -1.27f, 0.004f, 0.1f};
  fake_quantize(QuantFormat::int8, y.data(), 1, 4);
  EXPECT_FLOAT_EQ(y[1], -1.27f);
  EXPECT_FLOAT_EQ(y[0], 50 * 0.01f);
  EXPECT_FLOAT_EQ(y[2], 0.0f);  // 0.4 steps rounds to 0
  EXPECT_FLOAT_EQ(y[3], 10 * 0.01f);
}

TEST(QuantValidate, RejectsInconsistentShapes) {
  std::vector<float> w = normal(64, 6);
  QuantizedMatrix m = quantize_int4(w.data(), 2, 32, 32);
  EXPECT_NO_THROW(validate(m, "w"));
  QuantizedMatrix bad = m;
  bad.q.pop_back();
  EXPECT_THROW(validate(bad, "w"), kiln::Error);
  bad = m;
  bad.mins.clear();
  EXPECT_THROW(validate(bad, "w"), kiln::Error);
  bad = m;
  bad.scales[1] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(validate(bad, "w"), kiln::Error);
  bad = m;
  bad.group_size = 5;
  EXPECT_THROW(validate(bad, "w"), kiln::Error);
}

}  // namespace
}  // namespace kiln::quant
