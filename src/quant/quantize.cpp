#include "quant/quantize.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "quant/fp8_e4m3.h"

namespace kiln::quant {
namespace {

float amax_of(const float* x, int64_t n) {
  float a = 0;
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

QuantizedMatrix shaped(QuantFormat f, int64_t rows, int64_t cols, int64_t group) {
  KILN_CHECK(rows > 0 && cols > 0, invalid_argument, "cannot quantize an empty {}x{} matrix", rows, cols);
  return QuantizedMatrix::zeroed(f, rows, cols, group);
}

int8_t int8_of(float x, float inv_scale) {
  return int8_t(std::clamp(std::nearbyint(x * inv_scale), -127.0f, 127.0f));
}

}  // namespace

std::string_view format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::none: return "none";
    case QuantFormat::int8: return "int8";
    case QuantFormat::int4: return "int4";
    case QuantFormat::fp8: return "fp8";
  }
  return "?";
}

int64_t int4_group_for(int64_t cols, int64_t preferred) {
  for (int64_t g = preferred; g >= 32; g /= 2)
    if (cols % g == 0) return g;
  return 0;
}

QuantizedMatrix quantize_int8(const float* w, int64_t rows, int64_t cols) {
  QuantizedMatrix m = shaped(QuantFormat::int8, rows, cols, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    const float scale = amax_of(row, cols) / 127.0f;
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    m.scales[size_t(r)] = scale;
    for (int64_t c = 0; c < cols; ++c) m.q[size_t(r * cols + c)] = uint8_t(int8_of(row[c], inv));
  }
  return m;
}

Int4Grid int4_grid(const float* w, int64_t n) {
  const auto [lo, hi] = std::minmax_element(w, w + n);
  // The grid spans [min, max] exactly (GGUF Q4_1's form). AWQ/GPTQ round the offset to an integer
  // zero point (min = -zero * scale), which costs up to half a step on every weight and cannot
  // reproduce a Q4_1 group; kiln's kernels take any fp32 min, so nothing needs the integer. A
  // constant group gets a tiny scale rather than a division by zero.
  return {std::max(*hi - *lo, 1e-5f) / 15.0f, *lo};
}

void set_int4_code(QuantizedMatrix& m, int64_t at, float q) {
  const auto v = uint8_t(q);
  uint8_t& byte = m.q[size_t(at / 2)];
  byte = (at % 2 == 0) ? uint8_t((byte & 0xf0) | v) : uint8_t((byte & 0x0f) | (v << 4));
}

QuantizedMatrix quantize_int4(const float* w, int64_t rows, int64_t cols, int64_t group) {
  KILN_CHECK(group > 0 && group % 2 == 0 && cols % group == 0, invalid_argument,
             "int4 group size {} must be even and divide the row length {}", group, cols);
  QuantizedMatrix m = shaped(QuantFormat::int4, rows, cols, group);
  const int64_t groups = cols / group;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = w + r * cols + g * group;
      const Int4Grid grid = int4_grid(x, group);
      m.scales[size_t(r * groups + g)] = grid.scale;
      m.mins[size_t(r * groups + g)] = grid.min;
      for (int64_t c = 0; c < group; ++c) set_int4_code(m, r * cols + g * group + c, grid.code(x[c]));
    }
  }
  return m;
}

QuantizedMatrix quantize_fp8(const float* w, int64_t rows, int64_t cols) {
  QuantizedMatrix m = shaped(QuantFormat::fp8, rows, cols, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    const float amax = amax_of(row, cols);
    const float inv = amax > 0 ? kFp8E4M3Max / amax : 0.0f;
    m.scales[size_t(r)] = amax / kFp8E4M3Max;
    for (int64_t c = 0; c < cols; ++c) m.q[size_t(r * cols + c)] = f32_to_e4m3(row[c] * inv);
  }
  return m;
}

void dequantize_row(const QuantizedMatrix& m, int64_t r, float* out) {
  const int64_t groups = m.groups(), g_size = m.group_size;
  const uint8_t* q = m.q.data();
  switch (m.format) {
    case QuantFormat::int8:
      for (int64_t c = 0; c < m.cols; ++c)
        out[c] = float(int8_t(q[size_t(r * m.cols + c)])) * m.scales[size_t(r * groups + c / g_size)];
      return;
    case QuantFormat::int4:
      for (int64_t c = 0; c < m.cols; ++c) {
        const int64_t at = r * m.cols + c, g = r * groups + c / g_size;
        out[c] = float(int4_code(m, at)) * m.scales[size_t(g)] + m.mins[size_t(g)];
      }
      return;
    case QuantFormat::fp8:
      for (int64_t c = 0; c < m.cols; ++c)
        out[c] = e4m3_to_f32(q[size_t(r * m.cols + c)]) * m.scales[size_t(r * groups + c / g_size)];
      return;
    case QuantFormat::none: break;
  }
  KILN_FAIL(internal, "dequantize_row on a matrix that is not quantized");
}

void dequantize(const QuantizedMatrix& m, float* out) {
  for (int64_t r = 0; r < m.rows; ++r) dequantize_row(m, r, out + r * m.cols);
}

void validate(const QuantizedMatrix& m, std::string_view what) {
  KILN_CHECK(m.format != QuantFormat::none, invalid_model, "{}: not quantized", what);
  KILN_CHECK(m.rows > 0 && m.cols > 0 && m.group_size > 0 && m.cols % m.group_size == 0, invalid_model,
             "{}: {} group size {} does not divide the row length {}", what, format_name(m.format), m.group_size,
             m.cols);
  const bool int4 = m.format == QuantFormat::int4;
  KILN_CHECK(!int4 || m.cols % 2 == 0, invalid_model, "{}: an int4 row must have an even length, not {}", what,
             m.cols);
  const uint64_t q_bytes = uint64_t(m.rows) * uint64_t(m.cols) / (int4 ? 2 : 1);
  const uint64_t n_scales = uint64_t(m.rows) * uint64_t(m.groups());
  KILN_CHECK(m.q.size() == q_bytes && m.scales.size() == n_scales && m.mins.size() == (int4 ? n_scales : 0),
             invalid_model, "{}: {} data of {} bytes, {} scales and {} mins do not fit a {}x{} matrix in groups of {}",
             what, format_name(m.format), m.q.size(), m.scales.size(), m.mins.size(), m.rows, m.cols, m.group_size);
  for (size_t i = 0; i < m.scales.size(); ++i)
    KILN_CHECK(std::isfinite(m.scales[i]) && (!int4 || std::isfinite(m.mins[i])), invalid_model,
               "{}: scale or min {} is not finite", what, i);
}

void fake_quantize(QuantFormat f, float* x, int64_t n, int64_t len) {
  KILN_CHECK(f == QuantFormat::fp8 || f == QuantFormat::int8, internal, "fake_quantize supports fp8 and int8, not {}",
             format_name(f));
  for (int64_t s = 0; s < n; ++s) {
    float* seg = x + s * len;
    const float amax = amax_of(seg, len);
    if (!(amax > 0) || !std::isfinite(amax)) continue;  // zeros stay zeros; non-finite input stays visible
    if (f == QuantFormat::fp8) {
      const float inv = kFp8E4M3Max / amax, scale = amax / kFp8E4M3Max;
      for (int64_t i = 0; i < len; ++i) seg[i] = e4m3_to_f32(f32_to_e4m3(seg[i] * inv)) * scale;
    } else {
      const float scale = amax / 127.0f, inv = 1.0f / scale;
      for (int64_t i = 0; i < len; ++i) seg[i] = float(int8_of(seg[i], inv)) * scale;
    }
  }
}

}  // namespace kiln::quant
