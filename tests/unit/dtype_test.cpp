#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"

namespace kiln {
namespace {

TEST(Dtype, Fp16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;  // inf/nan
    float f = fp16_to_f32(uint16_t(h));
    EXPECT_EQ(f32_to_fp16(f), uint16_t(h)) << "half bits " << h;
  }
}

TEST(Dtype, Fp16KnownValues) {
  EXPECT_EQ(fp16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);               // rounds to infinity
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  for (int i = 0; i < 10000; ++i) {
    float x = dist(rng);
    EXPECT_LE(std::fabs(round_to_bf16(x) - x), std::fabs(x) * std::ldexp(1.0f, -8));
  }
}

}  // namespace
}  // namespace kiln
