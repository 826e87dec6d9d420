// FP8 E4M3 (the OCP "e4m3fn" variant Hopper's tensor cores use): 1 sign, 4 exponent (bias 7), 3
// mantissa bits; no infinities, 0x7F/0xFF are NaN, the largest finite value is 448.
//
// The encoder is bit-exact with CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) (and so
// with the __nv_fp8_e4m3(float) constructor and PTX cvt.rn.satfinite.e4m3x2.f32): round to nearest
// even, finite values past 448 and infinities saturate to +-448, |x| <= 2^-10 flushes to a signed
// zero, any NaN becomes 0x7F. The GPU's quantized weights and the CPU reference thus hold the same
// bytes.
#pragma once

#include <cstdint>

namespace kiln::quant {

inline constexpr float kFp8E4M3Max = 448.0f;

uint8_t f32_to_e4m3(float x);
float e4m3_to_f32(uint8_t q);

}  // namespace kiln::quant
