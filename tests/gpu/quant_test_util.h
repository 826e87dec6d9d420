// Random quantized matrices for the GPU tests: a QuantizedMatrix of random codes, scales and mins of a
// format and group size, with HostMatrix::data set to its dequantization (what the CPU reference
// multiplies with), and the W8A8 activation quantization of the CPU reference for fp8.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/weights.h"
#include "quant/fp8_e4m3.h"

namespace kiln::gputest {

inline float e4m3_value(uint8_t b) { return quant::e4m3_to_f32(b); }

// rows x cols; values of about +-amplitude. int8: codes -127..127, value q * s; int4: nibbles 0..15,
// value q * s + min with min about -8 s (asymmetric); fp8: any non-NaN byte, value e4m3(q) * s (one
// scale per row). Scales vary by 2x between groups.
inline HostMatrix random_quantized(QuantFormat f, int64_t rows, int64_t cols, int64_t group, uint32_t seed,
                                   float amplitude = 0.1f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(0.5f, 1.0f);
  HostMatrix m(rows, cols);
  QuantizedMatrix& q = m.quant;
  q.format = f;
  q.rows = rows;
  q.cols = cols;
  q.group_size = f == QuantFormat::fp8 ? cols : group;
  const int64_t groups = q.groups();
  q.scales.resize(size_t(rows * groups));
  if (f == QuantFormat::int4) q.mins.resize(q.scales.size());
  for (size_t i = 0; i < q.scales.size(); ++i) {
    const float u = unit(rng);
    q.scales[i] = f == QuantFormat::int8 ? amplitude * u / 127 : f == QuantFormat::int4 ? amplitude * u / 7.5f
                                                                                          : amplitude * u / 448;
    if (f == QuantFormat::int4) q.mins[i] = -(7.0f + unit(rng)) * q.scales[i];
  }
  q.q.resize(size_t(f == QuantFormat::int4 ? rows * cols / 2 : rows * cols));
  for (auto& b : q.q) {
    b = uint8_t(rng());
    if (f == QuantFormat::int8 && b == 0x80) b = 0x81;              // -128 -> -127 (symmetric)
    if (f == QuantFormat::fp8 && (b & 0x7F) == 0x7F) b ^= 1;         // NaN -> +-448
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      const size_t gi = size_t(r * groups + k / q.group_size);
      float v;
      if (f == QuantFormat::int8) {
        v = float(int8_t(q.q[size_t(r * cols + k)])) * q.scales[gi];
      } else if (f == QuantFormat::int4) {
        const uint8_t byte = q.q[size_t((r * cols + k) / 2)];
        v = float((k & 1) ? byte >> 4 : byte & 15) * q.scales[gi] + q.mins[gi];
      } else {
        v = e4m3_value(q.q[size_t(r * cols + k)]) * q.scales[gi];
      }
      m.data[size_t(r * cols + k)] = v;
    }
  return m;
}

// The CPU reference's W8A8 activations (quant::fake_quantize): each row quantized to e4m3 with scale
// amax / 448 (q = e4m3(x * 448 / amax)) and dequantized.
inline std::vector<float> fp8_fake_quantize_rows(std::vector<float> x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * cols;
    float amax = 0;
    for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(row[k]));
    if (!(amax > 0)) continue;
    const float inv = 448.0f / amax, scale = amax / 448.0f;
    for (int64_t k = 0; k < cols; ++k) row[k] = e4m3_value(quant::f32_to_e4m3(row[k] * inv)) * scale;
  }
  return x;
}

}  // namespace kiln::gputest
