#include "quant/fp8_e4m3.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::quant {

// Follows cuda_fp8.hpp's __nv_cvt_double_to_fp8, in fp32 bits (every fp32 is exact in the double
// CUDA's host path converts to, so the thresholds and round-off bits are the same).
uint8_t f32_to_e4m3(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;             // NaN (CUDA canonicalizes the sign away)
  if (abs <= 0x3a800000u) return sign;            // |x| <= 2^-10, half the smallest subnormal: zero
  if (abs > 0x43e80000u) return sign | 0x7e;      // > 464 = 448 + half an ulp (and inf): saturate
  const int exp = int(abs >> 23) - 127 + 7;       // the e4m3 biased exponent
  const uint32_t mantissa = abs & 0x7fffffu;
  uint32_t res;
  if (exp >= 1) {  // normal: keep 3 of 23 mantissa bits, round the other 20 to nearest even
    res = (uint32_t(exp) << 3) | (mantissa >> 20);
    const uint32_t round = mantissa & 0xfffffu, half = 0x80000u;
    if (round > half || (round == half && (res & 1u))) ++res;  // a carry into the exponent is right
  } else {         // subnormal: value = m * 2^-9, m in 0..7 (8 rounds up into the smallest normal)
    const uint32_t shift = uint32_t(1 - exp);            // 1..4 more bits shifted out
    const uint32_t full = mantissa | 0x800000u;          // with the implicit leading one
    res = full >> (20 + shift);
    const uint32_t round = full & ((1u << (20 + shift)) - 1), half = 1u << (19 + shift);
    if (round > half || (round == half && (res & 1u))) ++res;
  }
  return uint8_t(sign | res);
}

float e4m3_to_f32(uint8_t q) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) {
      const int e = (i >> 3) & 0xf, m = i & 7;
      float v;
      if ((i & 0x7f) == 0x7f) v = std::numeric_limits<float>::quiet_NaN();
      else if (e == 0) v = std::ldexp(float(m), -9);            // subnormal: m/8 * 2^-6
      else v = std::ldexp(1.0f + float(m) / 8.0f, e - 7);
      t[size_t(i)] = (i & 0x80) ? -v : v;
    }
    return t;
  }();
  return table[q];
}

}  // namespace kiln::quant
