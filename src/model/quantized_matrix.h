// The logical form of a quantized weight matrix (out_features rows, in_features cols), shared by
// the quantizer (src/quant), the loaders, the CPU reference and the GPU upload, which repacks it
// into its kernels' layout. One form covers kiln's own formats and the GGUF ones that run natively:
//
//   int8:  q = int8 (two's complement), value = q * scale.                 kiln int8 (group = cols,
//          per output channel), GGUF Q8_0 (group 32).
//   int4:  q = unsigned nibble 0..15, value = q * scale + min.             kiln int4 (group 128,
//          asymmetric: min = the group's minimum), GGUF Q4_0 (group 32, min = -8 * scale), Q4_1 and Q4_K
//          (group 32, scale = d * sc, min = -dmin * m).
//   fp8:   q = fp8 E4M3 byte, value = e4m3(q) * scale.                    kiln fp8 (group = cols);
//          activations are quantized per token at run time (W8A8).
//
// scales and mins hold one float per (row, group), row-major: index row * groups() + g.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

enum class QuantFormat : uint8_t { none, int8, int4, fp8 };

struct QuantizedMatrix {
  QuantFormat format = QuantFormat::none;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;       // columns sharing one scale (and min); divides cols
  std::vector<uint8_t> q;       // int8/fp8: rows * cols bytes; int4: rows * cols / 2 bytes, the even
                                // column in the low nibble of each byte
  std::vector<float> scales;    // rows * groups()
  std::vector<float> mins;      // int4 only: rows * groups()

  bool empty() const { return format == QuantFormat::none; }
  int64_t groups() const { return group_size ? cols / group_size : 0; }

  // A zeroed matrix of the given format and shape, its buffers sized (group divides cols).
  static QuantizedMatrix zeroed(QuantFormat f, int64_t rows, int64_t cols, int64_t group) {
    QuantizedMatrix m;
    m.format = f;
    m.rows = rows;
    m.cols = cols;
    m.group_size = group;
    m.q.resize(size_t(f == QuantFormat::int4 ? rows * cols / 2 : rows * cols));
    m.scales.resize(size_t(rows * (cols / group)));
    if (f == QuantFormat::int4) m.mins.resize(m.scales.size());
    return m;
  }
};

}  // namespace kiln
