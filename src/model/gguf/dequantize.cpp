#include "model/gguf/dequantize.h"

#include <cstring>

#include "core/check.h"
#include "core/dtype.h"
#include "model/gguf/ggml_types.h"

namespace kiln::gguf {

// Q4_K: {fp16 d; fp16 dmin; u8 scales[12]; u8 qs[128]}: 8 sub-blocks of 32, each with a 6-bit
// scale and 6-bit min packed into `scales`; x = d * sc * q - dmin * m.
void q4_k_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float load_fp16(const uint8_t* p) { return fp16_to_f32(load_u16(p)); }

// Q4_0: {fp16 d; u8 qs[16]}; low nibbles are elements 0-15, high nibbles 16-31; x = d * (q - 8).
void dequant_q4_0(const uint8_t* b, float* y) {
  float d = load_fp16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(qs[j] & 0xf) - 8);
    y[j + 16] = d * float(int(qs[j] >> 4) - 8);
  }
}

// Q4_1: {fp16 d; fp16 m; u8 qs[16]}; x = d * q + m.
void dequant_q4_1(const uint8_t* b, float* y) {
  float d = load_fp16(b), m = load_fp16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(qs[j] & 0xf) + m;
    y[j + 16] = d * float(qs[j] >> 4) + m;
  }
}

// Q8_0: {fp16 d; i8 qs[32]}; x = d * q.
void dequant_q8_0(const uint8_t* b, float* y) {
  float d = load_fp16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * float(qs[j]);
}

void dequant_q4_k(const uint8_t* b, float* y) {
  float d = load_fp16(b), dmin = load_fp16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
    uint8_t sc, m;
    q4_k_scale_min(is, scales, sc, m);
    float d1 = d * sc, m1 = dmin * m;
    q4_k_scale_min(is + 1, scales, sc, m);
    float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xf) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
    q += 32;
  }
}

// Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; fp16 d}: 6-bit values split into 4 low bits (ql)
// and 2 high bits (qh), 16 sub-blocks of 16 with an 8-bit scale each; x = d * sc * (q - 32).
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = load_fp16(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      int is = l / 16;
      int q1 = int((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = int((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * float(sc[is]) * float(q1);
      y[l + 32] = d * float(sc[is + 2]) * float(q2);
      y[l + 64] = d * float(sc[is + 4]) * float(q3);
      y[l + 96] = d * float(sc[is + 6]) * float(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return dequant_q4_0;
    case GgmlType::Q4_1: return dequant_q4_1;
    case GgmlType::Q8_0: return dequant_q8_0;
    case GgmlType::Q4_K: return dequant_q4_k;
    case GgmlType::Q6_K: return dequant_q6_k;
    default: return nullptr;
  }
}

}  // namespace

bool can_dequantize(uint32_t type_id) {
  GgmlType t = GgmlType(type_id);
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || block_fn(t) != nullptr;
}

void dequantize_row(uint32_t type_id, const uint8_t* src, float* dst, int64_t n) {
  GgmlType t = GgmlType(type_id);
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(load_u16(src + 2 * i));
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    default: break;
  }
  BlockFn fn = block_fn(t);
  auto traits = type_traits(type_id);
  KILN_CHECK(fn && traits, unsupported, "kiln cannot convert ggml type {} yet", traits ? traits->name : "unknown");
  KILN_CHECK(n % traits->block_elems == 0, internal, "dequantize_row: {} elements is not whole blocks", n);
  for (int64_t b = 0; b < n / traits->block_elems; ++b) fn(src + b * traits->block_bytes, dst + b * traits->block_elems);
}

}  // namespace kiln::gguf
