// Scalar conversions between fp32 and the 16-bit float formats kiln stores (IEEE fp16, bf16).
// Host-side only; the CUDA kernels use cuda_bf16.h.
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln {

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as the GPU's __float2bfloat16 does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);

}  // namespace kiln
