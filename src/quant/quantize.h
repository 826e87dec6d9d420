// Weight quantizers for kiln's formats (model/quantized_matrix.h defines the forms) and their
// dequantization, plus the fake-quantization the CPU reference applies to activations and to the
// KV cache so that it computes what the GPU's quantized kernels compute.
//
//   int8: symmetric per output channel: scale = amax(row) / 127, q = round(w / scale).
//   int4: asymmetric groups along the input dimension: scale = (max - min) / 15, q =
//         clamp(round((w - min) / scale), 0, 15), value = q * scale + min (min the group's minimum,
//         as GGUF Q4_1; AWQ/GPTQ round it to an integer zero point, kiln does not). The group is 128 columns when 128 divides the row,
//         else the largest of 64 and 32 that does (SmolLM2's hidden size 576 is 4.5 x 128);
//         `kiln quantize --group` picks another starting size.
//   fp8:  E4M3 per output channel: scale = amax(row) / 448, q = e4m3(w * (448 / amax)).
//
// round() is round-half-to-even (std::nearbyint), so results do not depend on the platform.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>

#include "model/quantized_matrix.h"

namespace kiln::quant {

QuantizedMatrix quantize_int8(const float* w, int64_t rows, int64_t cols);
QuantizedMatrix quantize_int4(const float* w, int64_t rows, int64_t cols, int64_t group_size);
QuantizedMatrix quantize_fp8(const float* w, int64_t rows, int64_t cols);

// One int4 group's grid (quantize_int4's rule, also what AWQ's clipping search and GPTQ quantize
// with): the group's [min, max] in 15 steps, value = code * scale + min.
struct Int4Grid {
  float scale = 1.0f, min = 0.0f;
  float code(float w) const { return std::clamp(std::nearbyint((w - min) / scale), 0.0f, 15.0f); }
  float value(float code) const { return code * scale + min; }
};
Int4Grid int4_grid(const float* w, int64_t n);
// Code q (0..15) of element `at` (row-major over the whole matrix) of an int4 QuantizedMatrix.
void set_int4_code(QuantizedMatrix& m, int64_t at, float q);
// The code at element `at` (row * cols + col) of an int4 matrix.
inline int int4_code(const QuantizedMatrix& m, int64_t at) {
  const uint8_t byte = m.q[size_t(at / 2)];
  return (at % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
}

// The int4 group kiln uses for rows of `cols`: `preferred` (128 by default; a power of two >= 32)
// when it divides cols, else the largest of its halves down to 32 that does, else 0 (the row cannot
// be quantized to int4).
int64_t int4_group_for(int64_t cols, int64_t preferred = 128);

// Row r of the matrix as fp32 (cols floats): what the CPU reference computes with.
void dequantize_row(const QuantizedMatrix& m, int64_t r, float* out);
// The whole matrix, rows * cols floats.
void dequantize(const QuantizedMatrix& m, float* out);

// A QuantizedMatrix's shape, group and buffer sizes are consistent (kiln::Error invalid_model
// naming `what` otherwise); scales and mins are finite. Loaders call it on what they read.
void validate(const QuantizedMatrix& m, std::string_view what);

// "none", "int8", "int4", "fp8".
std::string_view format_name(QuantFormat f);

// Quantize-dequantize in place, `n` consecutive segments of `len` floats, each with its own scale:
//   fp8:  scale = amax / 448, x = e4m3(x * 448 / amax) * scale (per-token activations; KV cache)
//   int8: scale = amax / 127, x = round(x / scale) * scale      (KV cache)
// A segment of zeros stays zero. Other formats are rejected (kiln::Error internal).
void fake_quantize(QuantFormat f, float* x, int64_t n, int64_t len);

}  // namespace kiln::quant
