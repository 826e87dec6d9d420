// dequantize_row against values computed independently of it: hand-built blocks whose expected
// floats follow from the format description (CONVENTIONS.md, ggml's quantize_*_ref packing), and
// random blocks dequantized by llama.cpp's gguf-py (tests/data/gguf/dequant_fixture.json, written
// by python/make_dequant_fixture.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "gguf_builder.h"
#include "kiln/error.h"
#include "model/gguf/dequantize.h"

namespace kiln::gguf {
namespace {

using namespace kiln::gguf::testing;

// fp16 bit patterns of the scales used below (exact in fp16).
constexpr uint16_t kHalf = 0x3800;        // 0.5
constexpr uint16_t kQuarter = 0x3400;     // 0.25
constexpr uint16_t kOne = 0x3c00;         // 1.0
constexpr uint16_t kMinusOne = 0xbc00;    // -1.0
constexpr uint16_t kEighth = 0x3000;      // 0.125
constexpr uint16_t kMinusTwo = 0xc000;    // -2.0

std::vector<float> dequant(uint32_t type, const Bytes& src, int64_t n) {
  std::vector<float> out(size_t(n), std::numeric_limits<float>::quiet_NaN());
  dequantize_row(type, src.data(), out.data(), n);
  return out;
}

TEST(GgufDequant, F32IsACopy) {
  std::vector<float> values = {1.5f, -0.0f, 3e38f, std::numeric_limits<float>::denorm_min()};
  EXPECT_EQ(dequant(gt::F32, to_bytes(values), 4), values);
}

TEST(GgufDequant, F16) {
  Bytes src = to_bytes(std::vector<uint16_t>{0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x3555, 0x7c00, 0xfc00});
  std::vector<float> got = dequant(gt::F16, src, 8);
  std::vector<float> want = {1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), -0.0f, 0.333251953125f,
                             std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(got, want);
  EXPECT_TRUE(std::signbit(got[4]));
  EXPECT_TRUE(std::isnan(dequant(gt::F16, to_bytes(std::vector<uint16_t>{0x7e00}), 1)[0]));
}

TEST(GgufDequant, BF16) {
  // bf16 is the top half of an fp32: 0xc2f7 -> 0xc2f70000 = -123.5.
  Bytes src = to_bytes(std::vector<uint16_t>{0x3f80, 0xc2f7, 0x0001, 0x7f80, 0x8000});
  std::vector<float> got = dequant(gt::BF16, src, 5);
  std::vector<float> want = {1.0f, -123.5f, std::ldexp(1.0f, -133), std::numeric_limits<float>::infinity(), -0.0f};
  EXPECT_EQ(got, want);
}

TEST(GgufDequant, Q8_0) {
  // Two blocks: {d = 0.25, q = 4j - 64}, {d = -2, q = j - 128 clipped to int8}.
  Bytes src;
  put<uint16_t>(src, kQuarter);
  for (int j = 0; j < 32; ++j) put<int8_t>(src, int8_t(4 * j - 64));
  put<uint16_t>(src, kMinusTwo);
  for (int j = 0; j < 32; ++j) put<int8_t>(src, int8_t(j == 0 ? -128 : 127 - j));
  ASSERT_EQ(src.size(), 68u);
  std::vector<float> got = dequant(gt::Q8_0, src, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(got[j], 0.25f * float(4 * j - 64)) << j;
    EXPECT_EQ(got[32 + j], -2.0f * float(j == 0 ? -128 : 127 - j)) << j;
  }
}

TEST(GgufDequant, Q4_0) {
  // Byte j holds element j in its low nibble (value j) and element j + 16 in its high nibble
  // (value 15 - j); x = d * (q - 8). Second block has d = -1 and every nibble 0xf.
  Bytes src;
  put<uint16_t>(src, kHalf);
  for (int j = 0; j < 16; ++j) put<uint8_t>(src, uint8_t(j | ((15 - j) << 4)));
  put<uint16_t>(src, kMinusOne);
  for (int j = 0; j < 16; ++j) put<uint8_t>(src, 0xff);
  ASSERT_EQ(src.size(), 36u);
  std::vector<float> got = dequant(gt::Q4_0, src, 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(got[j], float(j - 8) * 0.5f) << j;
    EXPECT_EQ(got[16 + j], float(15 - j - 8) * 0.5f) << j;
  }
  EXPECT_EQ(got[0], -4.0f);   // q = 0
  EXPECT_EQ(got[15], 3.5f);   // q = 15
  EXPECT_EQ(got[16], 3.5f);   // high nibble of byte 0
  for (int j = 32; j < 64; ++j) EXPECT_EQ(got[j], -7.0f) << j;
}

TEST(GgufDequant, Q4_1) {
  // x = d * q + m with d = 0.25, m = -1; same nibble layout as Q4_0.
  Bytes src;
  put<uint16_t>(src, kQuarter);
  put<uint16_t>(src, kMinusOne);
  for (int j = 0; j < 16; ++j) put<uint8_t>(src, uint8_t(j | ((15 - j) << 4)));
  ASSERT_EQ(src.size(), 20u);
  std::vector<float> got = dequant(gt::Q4_1, src, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(got[j], 0.25f * float(j) - 1.0f) << j;
    EXPECT_EQ(got[16 + j], 0.25f * float(15 - j) - 1.0f) << j;
  }
}

// Q4_K: 8 sub-blocks of 32 with 6-bit scales sc[s] and mins m[s], packed into 12 bytes as ggml's
// quantize_row_q4_K_ref does: bytes 0-3 hold sc[0..3] and the top 2 bits of sc[4..7], bytes 4-7
// the same for m, bytes 8-11 the low 4 bits of sc[4..7] (low nibble) and m[4..7] (high nibble).
// Within each 64 elements, 32 bytes hold the first 32 in their low nibbles, the next 32 high.
Bytes pack_q4_k(uint16_t d, uint16_t dmin, const uint8_t (&sc)[8], const uint8_t (&m)[8], const uint8_t (&q)[256]) {
  Bytes b;
  put<uint16_t>(b, d);
  put<uint16_t>(b, dmin);
  for (int j = 0; j < 4; ++j) put<uint8_t>(b, uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6)));
  for (int j = 0; j < 4; ++j) put<uint8_t>(b, uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6)));
  for (int j = 0; j < 4; ++j) put<uint8_t>(b, uint8_t((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4)));
  for (int chunk = 0; chunk < 4; ++chunk)
    for (int l = 0; l < 32; ++l) put<uint8_t>(b, uint8_t(q[64 * chunk + l] | (q[64 * chunk + 32 + l] << 4)));
  return b;
}

TEST(GgufDequant, Q4_K) {
  // Scales and mins above 15 and above 47 exercise the high bits of the 6-bit packing.
  const uint8_t sc[8] = {1, 2, 3, 63, 40, 17, 48, 5};
  const uint8_t m[8] = {0, 9, 33, 62, 50, 16, 63, 1};
  uint8_t q[256];
  for (int e = 0; e < 256; ++e) q[e] = uint8_t((e * 7 + e / 32) % 16);
  Bytes src = pack_q4_k(kOne, kHalf, sc, m, q);
  ASSERT_EQ(src.size(), 144u);
  std::vector<float> got = dequant(gt::Q4_K, src, 256);
  for (int e = 0; e < 256; ++e) {
    int s = e / 32;
    EXPECT_EQ(got[e], 1.0f * float(sc[s]) * float(q[e]) - 0.5f * float(m[s])) << e;
  }
}

// Q6_K: 6-bit q per element, low 4 bits in ql, high 2 in qh, laid out per 128 elements as ggml's
// quantize_row_q6_K_ref does; 16 int8 scales, one per 16 elements; x = d * sc * (q - 32).
Bytes pack_q6_k(uint16_t d, const int8_t (&sc)[16], const uint8_t (&q)[256]) {
  uint8_t ql[128] = {}, qh[64] = {};
  for (int half = 0; half < 2; ++half) {
    const uint8_t* L = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      ql[64 * half + l] = uint8_t((L[l] & 0xf) | ((L[l + 64] & 0xf) << 4));
      ql[64 * half + l + 32] = uint8_t((L[l + 32] & 0xf) | ((L[l + 96] & 0xf) << 4));
      qh[32 * half + l] =
          uint8_t((L[l] >> 4) | ((L[l + 32] >> 4) << 2) | ((L[l + 64] >> 4) << 4) | ((L[l + 96] >> 4) << 6));
    }
  }
  Bytes b(ql, ql + 128);
  b.insert(b.end(), qh, qh + 64);
  for (int8_t s : sc) put<int8_t>(b, s);
  put<uint16_t>(b, d);
  return b;
}

TEST(GgufDequant, Q6_K) {
  const int8_t sc[16] = {1, -1, 2, -2, 127, -128, 3, 0, 5, 7, -9, 11, 13, -15, 17, 64};
  uint8_t q[256];
  for (int e = 0; e < 256; ++e) q[e] = uint8_t((e * 11 + 3) % 64);
  Bytes src = pack_q6_k(kEighth, sc, q);
  ASSERT_EQ(src.size(), 210u);
  std::vector<float> got = dequant(gt::Q6_K, src, 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(got[e], 0.125f * float(sc[e / 16]) * float(int(q[e]) - 32)) << e;
  }
}

TEST(GgufDequant, RejectsTypesItCannotConvert) {
  EXPECT_TRUE(can_dequantize(gt::Q6_K));
  EXPECT_FALSE(can_dequantize(13));   // Q5_K
  EXPECT_FALSE(can_dequantize(999));
  Bytes src(256, 0);
  std::vector<float> out(256);
  EXPECT_THROW(dequantize_row(13, src.data(), out.data(), 256), Error);
  EXPECT_THROW(dequantize_row(999, src.data(), out.data(), 256), Error);
}

// Random blocks (random bytes, finite random fp16 scales) against gguf-py's numpy dequantizer.
TEST(GgufDequant, MatchesGgufPyOnRandomBlocks) {
  std::ifstream in(std::string(KILN_TEST_DATA) + "/gguf/dequant_fixture.json");
  ASSERT_TRUE(in) << "missing tests/data/gguf/dequant_fixture.json (python/make_dequant_fixture.py)";
  nlohmann::json fixture = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : fixture.at("cases")) {
    SCOPED_TRACE(c.at("type").get<std::string>());
    std::string hex = c.at("hex");
    Bytes src;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) src.push_back(uint8_t(std::stoi(hex.substr(i, 2), nullptr, 16)));
    int64_t n = c.at("n");
    std::vector<float> want;
    for (double v : c.at("expected")) want.push_back(float(v));
    ASSERT_EQ(int64_t(want.size()), n);
    std::vector<float> got = dequant(c.at("type_id").get<uint32_t>(), src, n);
    // 1e-6 relative. Results that cancel to near 0 (d*sc*q - dmin*m) are compared relative to 1% of
    // the row's largest value instead, so a compiler that contracts to FMA still passes.
    float largest = 0;
    for (float v : want) largest = std::max(largest, std::fabs(v));
    for (int64_t i = 0; i < n; ++i) {
      float tol = 1e-6f * std::max(std::fabs(want[size_t(i)]), largest * 0.01f);
      ASSERT_NEAR(got[size_t(i)], want[size_t(i)], tol) << "element " << i;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 5);  // Q4_0, Q4_1, Q8_0, Q4_K, Q6_K
}

}  // namespace
}  // namespace kiln::gguf
