#include "model/gguf/gguf_quant.h"

#include <cstring>

#include "core/check.h"
#include "core/dtype.h"
#include "model/gguf/dequantize.h"
#include "quant/quantize.h"

namespace kiln::gguf {
namespace {

float fp16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// Writes 32 nibbles (element j's value in nib[j]) as 16 bytes, even element in the low nibble.
void put_nibbles(const uint8_t* nib, uint8_t* out) {
  for (int i = 0; i < 16; ++i) out[i] = uint8_t(nib[2 * i] | (nib[2 * i + 1] << 4));
}

// One GGUF block of 32 (or Q4_K's 256) elements into group g.. of the matrix.
void repack_block(GgmlType type, const uint8_t* b, QuantizedMatrix& m, int64_t g, int64_t elem) {
  uint8_t nib[32];
  switch (type) {
    case GgmlType::Q8_0:
      m.scales[size_t(g)] = fp16_at(b);
      std::memcpy(m.q.data() + elem, b + 2, 32);
      return;
    case GgmlType::Q4_0:
    case GgmlType::Q4_1: {
      // Q4_0: {d; qs[16]}, x = d * (q - 8); Q4_1: {d; m; qs[16]}, x = d * q + m. Low nibbles are
      // elements 0-15, high nibbles 16-31.
      const bool q4_1 = type == GgmlType::Q4_1;
      const float d = fp16_at(b);
      const uint8_t* qs = b + (q4_1 ? 4 : 2);
      m.scales[size_t(g)] = d;
      m.mins[size_t(g)] = q4_1 ? fp16_at(b + 2) : -8.0f * d;
      for (int j = 0; j < 16; ++j) {
        nib[j] = qs[j] & 0xf;
        nib[j + 16] = qs[j] >> 4;
      }
      put_nibbles(nib, m.q.data() + elem / 2);
      return;
    }
    case GgmlType::Q4_K: {
      // 8 sub-blocks of 32: pair p (0..3) takes the low then the high nibbles of qs[32p .. 32p+31].
      const float d = fp16_at(b), dmin = fp16_at(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qs = b + 16;
      for (int sub = 0; sub < 8; ++sub) {
        uint8_t sc, mn;
        q4_k_scale_min(sub, scales, sc, mn);
        m.scales[size_t(g + sub)] = d * float(sc);
        m.mins[size_t(g + sub)] = -(dmin * float(mn));
        const uint8_t* q = qs + 32 * (sub / 2);
        for (int j = 0; j < 32; ++j) nib[j] = (sub % 2 == 0) ? (q[j] & 0xf) : (q[j] >> 4);
        put_nibbles(nib, m.q.data() + (elem + 32 * sub) / 2);
      }
      return;
    }
    default: KILN_FAIL(internal, "repack_block: unexpected type");
  }
}

std::optional<QuantizedMatrix> from_ggml_blocks(const TensorInfo& t, int64_t rows, int64_t cols) {
  const GgmlType type = GgmlType(t.type);
  QuantFormat f;
  switch (type) {
    case GgmlType::Q8_0: f = QuantFormat::int8; break;
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q4_K: f = QuantFormat::int4; break;
    default: return std::nullopt;
  }
  const auto traits = *type_traits(t.type);
  QuantizedMatrix m = QuantizedMatrix::zeroed(f, rows, cols, 32);
  const int64_t blocks_per_row = cols / traits.block_elems, groups_per_block = traits.block_elems / 32;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks_per_row; ++b)
      repack_block(type, t.data + (r * blocks_per_row + b) * traits.block_bytes, m,
                   (r * blocks_per_row + b) * groups_per_block, r * cols + b * traits.block_elems);
  return m;
}

// A companion of kiln tensor `t`: F32, ne = [groups, rows]; copied into `out`.
void read_companion(const GgufFile& f, const TensorInfo& t, const char* suffix, int64_t rows, int64_t& groups,
                    std::vector<float>& out) {
  const std::string name = t.name + suffix;
  const TensorInfo* c = f.find_tensor(name);
  KILN_CHECK(c, invalid_model, "tensor '{}' ({}) lacks its companion '{}'", t.name, type_traits(t.type)->name, name);
  KILN_CHECK(c->type == uint32_t(GgmlType::F32) && c->ne.size() == 2 && int64_t(c->ne[1]) == rows &&
                 (groups == 0 || int64_t(c->ne[0]) == groups),
             invalid_model, "tensor '{}' must be F32 of shape [groups, {}]{}, got {} {}", name, rows,
             groups ? fmt::format(" with {} groups", groups) : "", type_traits(c->type)->name, c->shape_string());
  groups = int64_t(c->ne[0]);
  out.resize(size_t(c->n_elements));
  std::memcpy(out.data(), c->data, size_t(c->n_bytes));
}

QuantizedMatrix from_kiln_tensor(const GgufFile& f, const TensorInfo& t, int64_t rows, int64_t cols) {
  KILN_CHECK(f.get_int(kQuantVersionKey).value_or(0) == 1, invalid_model,
             "tensor '{}' has kiln's type {} but the file lacks {} = 1 (written by a newer or broken kiln?)", t.name,
             type_traits(t.type)->name, kQuantVersionKey);
  const GgmlType type = GgmlType(t.type);
  QuantizedMatrix m;
  m.format = type == GgmlType::KILN_INT8 ? QuantFormat::int8
             : type == GgmlType::KILN_INT4 ? QuantFormat::int4 : QuantFormat::fp8;
  m.rows = rows;
  m.cols = cols;
  int64_t groups = 0;
  read_companion(f, t, ".scales", rows, groups, m.scales);
  if (m.format == QuantFormat::int4) read_companion(f, t, ".mins", rows, groups, m.mins);
  KILN_CHECK(cols % groups == 0, invalid_model, "tensor '{}': {} groups do not divide its {} columns", t.name, groups,
             cols);
  m.group_size = cols / groups;
  m.q.assign(t.data, t.data + t.n_bytes);
  quant::validate(m, "tensor '" + t.name + "'");
  return m;
}

}  // namespace

bool is_kiln_type(uint32_t type_id) {
  return type_id >= uint32_t(GgmlType::KILN_INT8) && type_id <= uint32_t(GgmlType::KILN_FP8);
}

std::optional<QuantizedMatrix> quantized_form(const GgufFile& f, const TensorInfo& t, int64_t rows, int64_t cols) {
  if (is_kiln_type(t.type)) return from_kiln_tensor(f, t, rows, cols);
  return from_ggml_blocks(t, rows, cols);
}

}  // namespace kiln::gguf
