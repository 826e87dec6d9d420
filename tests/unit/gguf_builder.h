// An in-memory GGUF writer for tests and the fuzzer's seed corpus.
//
// It writes exactly what it is told, including things a real writer never would (n_dims 0, unknown
// types, misaligned offsets, a header count that disagrees with the entries), so each bad-file test
// reads as "build a good file, break one thing". Layout follows ggml's docs/gguf.md: header, KV
// pairs, tensor infos, padding to the alignment, then tensor data, each tensor's data padded to the
// alignment except the last (so that every proper prefix of a built file is truncated data).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/gguf/gguf_file.h"

namespace kiln::gguf::testing {

// Value type ids as GGUF stores them (mirrors kiln::gguf::ValueType without depending on it, so a
// wrong id in the parser's enum would not silently agree with the tests).
namespace vt {
constexpr uint32_t U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8,
                   ARRAY = 9, U64 = 10, I64 = 11, F64 = 12;
}  // namespace vt

// ggml type ids used by the tests.
namespace gt {
constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14, I8 = 24, F64 = 28, BF16 = 30;
}  // namespace gt

using Bytes = std::vector<uint8_t>;

template <typename T>
void put(Bytes& out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // the test hosts are little-endian, like GGUF
  out.insert(out.end(), raw, raw + sizeof(T));
}

inline void put_string(Bytes& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// Overwrites sizeof(T) bytes at `at`: breaks one field of an already built file.
template <typename T>
void patch(Bytes& bytes, size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

template <typename T>
Bytes to_bytes(const std::vector<T>& values) {
  Bytes out;
  for (const T& v : values) put(out, v);
  return out;
}

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Where the builder put things, for tests that patch or truncate a built file.
struct Layout {
  uint64_t infos_begin = 0;  // first tensor info
  uint64_t infos_end = 0;    // end of the last tensor info (before padding)
  uint64_t data_start = 0;   // aligned start of the data section
  std::vector<uint64_t> kv_type_at;      // offset of each KV's u32 value type
  std::vector<uint64_t> tensor_info_at;  // offset of each tensor info (its name length)
  std::vector<uint64_t> tensor_data_at;  // absolute offset of each tensor's data
};

class GgufBuilder {
 public:
  GgufBuilder& version(uint32_t v) { version_ = v; return *this; }
  // Header counts that disagree with the entries written (default: the true counts).
  GgufBuilder& tensor_count(uint64_t n) { tensor_count_ = n; return *this; }
  GgufBuilder& kv_count(uint64_t n) { kv_count_ = n; return *this; }
  // Alignment used to lay out the data section; does not write general.alignment.
  GgufBuilder& data_alignment(uint64_t a) { alignment_ = a; return *this; }
  // Writes general.alignment (u32) and lays the data out with it.
  GgufBuilder& alignment(uint32_t a) { kv_u32("general.alignment", a); return data_alignment(a); }

  // A KV pair with any type id and raw payload: the escape hatch for malformed values.
  GgufBuilder& kv_raw(std::string key, uint32_t type, Bytes payload) {
    kvs_.push_back({std::move(key), type, std::move(payload)});
    return *this;
  }
  template <typename T>
  GgufBuilder& kv_scalar(std::string key, uint32_t type, T value) {
    Bytes p;
    put(p, value);
    return kv_raw(std::move(key), type, std::move(p));
  }
  GgufBuilder& kv_u8(std::string k, uint8_t v) { return kv_scalar(std::move(k), vt::U8, v); }
  GgufBuilder& kv_i8(std::string k, int8_t v) { return kv_scalar(std::move(k), vt::I8, v); }
  GgufBuilder& kv_u16(std::string k, uint16_t v) { return kv_scalar(std::move(k), vt::U16, v); }
  GgufBuilder& kv_i16(std::string k, int16_t v) { return kv_scalar(std::move(k), vt::I16, v); }
  GgufBuilder& kv_u32(std::string k, uint32_t v) { return kv_scalar(std::move(k), vt::U32, v); }
  GgufBuilder& kv_i32(std::string k, int32_t v) { return kv_scalar(std::move(k), vt::I32, v); }
  GgufBuilder& kv_f32(std::string k, float v) { return kv_scalar(std::move(k), vt::F32, v); }
  GgufBuilder& kv_bool(std::string k, bool v) { return kv_scalar(std::move(k), vt::BOOL, uint8_t(v)); }
  GgufBuilder& kv_u64(std::string k, uint64_t v) { return kv_scalar(std::move(k), vt::U64, v); }
  GgufBuilder& kv_i64(std::string k, int64_t v) { return kv_scalar(std::move(k), vt::I64, v); }
  GgufBuilder& kv_f64(std::string k, double v) { return kv_scalar(std::move(k), vt::F64, v); }
  GgufBuilder& kv_string(std::string k, std::string_view v) {
    Bytes p;
    put_string(p, v);
    return kv_raw(std::move(k), vt::STRING, std::move(p));
  }
  // A numeric or bool array; T is the element's C++ type (uint8_t for bool).
  template <typename T>
  GgufBuilder& kv_array(std::string k, uint32_t elem_type, const std::vector<T>& values) {
    Bytes p;
    put<uint32_t>(p, elem_type);
    put<uint64_t>(p, values.size());
    for (const T& v : values) put(p, v);
    return kv_raw(std::move(k), vt::ARRAY, std::move(p));
  }
  GgufBuilder& kv_string_array(std::string k, const std::vector<std::string>& values) {
    Bytes p;
    put<uint32_t>(p, vt::STRING);
    put<uint64_t>(p, values.size());
    for (const auto& v : values) put_string(p, v);
    return kv_raw(std::move(k), vt::ARRAY, std::move(p));
  }

  // A tensor with ne as given (n_dims = ne.size(), even 0 or 5) and raw data. `offset` overrides
  // the offset written in the info; the data still goes where a correct offset would point.
  GgufBuilder& tensor(std::string name, std::vector<uint64_t> ne, uint32_t type, Bytes data,
                      std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({std::move(name), std::move(ne), type, std::move(data), offset});
    return *this;
  }
  GgufBuilder& tensor_f32(std::string name, std::vector<uint64_t> ne, const std::vector<float>& values) {
    return tensor(std::move(name), std::move(ne), gt::F32, to_bytes(values));
  }

  // Drops a KV pair added earlier (to replace its value without writing a duplicate key).
  GgufBuilder& remove_kv(std::string_view key) {
    std::erase_if(kvs_, [&](const Kv& kv) { return kv.key == key; });
    return *this;
  }
  // Drops a tensor added earlier (to build "the same model, minus one tensor").
  GgufBuilder& remove_tensor(std::string_view name) {
    std::erase_if(tensors_, [&](const Tensor& t) { return t.name == name; });
    return *this;
  }

  Bytes build(Layout* layout = nullptr) const {
    Layout l;
    Bytes out = {'G', 'G', 'U', 'F'};
    put<uint32_t>(out, version_);
    put<uint64_t>(out, tensor_count_.value_or(tensors_.size()));
    put<uint64_t>(out, kv_count_.value_or(kvs_.size()));
    for (const Kv& kv : kvs_) {
      put_string(out, kv.key);
      l.kv_type_at.push_back(out.size());
      put<uint32_t>(out, kv.type);
      out.insert(out.end(), kv.payload.begin(), kv.payload.end());
    }
    // Natural offsets: each tensor's data starts aligned, right after the previous one.
    std::vector<uint64_t> offsets;
    uint64_t data_size = 0;
    for (const Tensor& t : tensors_) {
      data_size = align_up(data_size, alignment_);
      offsets.push_back(data_size);
      data_size += t.data.size();
    }
    l.infos_begin = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      l.tensor_info_at.push_back(out.size());
      put_string(out, t.name);
      put<uint32_t>(out, uint32_t(t.ne.size()));
      for (uint64_t n : t.ne) put<uint64_t>(out, n);
      put<uint32_t>(out, t.type);
      put<uint64_t>(out, t.offset.value_or(offsets[i]));
    }
    l.infos_end = out.size();
    l.data_start = align_up(out.size(), alignment_);
    if (!tensors_.empty()) {
      out.resize(l.data_start + data_size, 0);
      for (size_t i = 0; i < tensors_.size(); ++i) {
        l.tensor_data_at.push_back(l.data_start + offsets[i]);
        const Bytes& d = tensors_[i].data;
        if (!d.empty()) std::memcpy(out.data() + l.data_start + offsets[i], d.data(), d.size());
      }
    }
    if (layout) *layout = std::move(l);
    return out;
  }

 private:
  struct Kv {
    std::string key;
    uint32_t type;
    Bytes payload;
  };
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    Bytes data;
    std::optional<uint64_t> offset;
  };

  uint32_t version_ = 3;
  uint64_t alignment_ = 32;
  std::optional<uint64_t> tensor_count_, kv_count_;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

// A tiny Llama-family model: the metadata config_from_gguf reads and every tensor it expects,
// F32, ne = [cols, rows] as llama.cpp writes HF's [rows, cols] weights.
struct TinyModel {
  std::string arch = "llama";
  uint64_t vocab = 32, hidden = 64, intermediate = 128, layers = 2, heads = 4, kv_heads = 2, context = 256;
  bool tied = false;     // no output.weight
  bool qkv_bias = false;  // qwen2 style attn_{q,k,v}.bias
};

// Element i of a tiny model's tensor `name`: differs between tensors, exact in fp32.
inline float tiny_value(std::string_view name, uint64_t i) {
  uint32_t h = 0;
  for (char c : name) h = h * 31 + uint8_t(c);
  return float(h % 97) + float(int(i % 64) - 32) / 64.0f;
}

inline void add_tiny_tensor(GgufBuilder& b, const std::string& name, std::vector<uint64_t> ne) {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  std::vector<float> values(n);
  for (uint64_t i = 0; i < n; ++i) values[i] = tiny_value(name, i);
  b.tensor_f32(name, std::move(ne), values);
}

inline GgufBuilder tiny_model(const TinyModel& m = {}) {
  GgufBuilder b;
  const std::string& a = m.arch;
  uint64_t head_dim = m.hidden / m.heads, q_dim = m.heads * head_dim, kv_dim = m.kv_heads * head_dim;
  b.kv_string("general.architecture", a).kv_string("general.name", "tiny");
  b.kv_u32(a + ".context_length", uint32_t(m.context)).kv_u32(a + ".embedding_length", uint32_t(m.hidden));
  b.kv_u32(a + ".block_count", uint32_t(m.layers)).kv_u32(a + ".feed_forward_length", uint32_t(m.intermediate));
  b.kv_u32(a + ".attention.head_count", uint32_t(m.heads));
  b.kv_u32(a + ".attention.head_count_kv", uint32_t(m.kv_heads));
  b.kv_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f).kv_f32(a + ".rope.freq_base", 500000.0f);
  b.kv_u32(a + ".rope.dimension_count", uint32_t(head_dim));
  add_tiny_tensor(b, "token_embd.weight", {m.hidden, m.vocab});
  for (uint64_t l = 0; l < m.layers; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    add_tiny_tensor(b, p + "attn_norm.weight", {m.hidden});
    add_tiny_tensor(b, p + "attn_q.weight", {m.hidden, q_dim});
    add_tiny_tensor(b, p + "attn_k.weight", {m.hidden, kv_dim});
    add_tiny_tensor(b, p + "attn_v.weight", {m.hidden, kv_dim});
    if (m.qkv_bias) {
      add_tiny_tensor(b, p + "attn_q.bias", {q_dim});
      add_tiny_tensor(b, p + "attn_k.bias", {kv_dim});
      add_tiny_tensor(b, p + "attn_v.bias", {kv_dim});
    }
    add_tiny_tensor(b, p + "attn_output.weight", {q_dim, m.hidden});
    add_tiny_tensor(b, p + "ffn_norm.weight", {m.hidden});
    add_tiny_tensor(b, p + "ffn_gate.weight", {m.hidden, m.intermediate});
    add_tiny_tensor(b, p + "ffn_up.weight", {m.hidden, m.intermediate});
    add_tiny_tensor(b, p + "ffn_down.weight", {m.intermediate, m.hidden});
  }
  add_tiny_tensor(b, "output_norm.weight", {m.hidden});
  if (!m.tied) add_tiny_tensor(b, "output.weight", {m.hidden, m.vocab});
  return b;
}

// Owns the bytes a GgufFile parsed from them points into.
struct Loaded {
  Bytes bytes;
  GgufFile file;
  explicit Loaded(Bytes b) : bytes(std::move(b)), file(GgufFile::parse(std::span<const uint8_t>(bytes))) {}
};

}  // namespace kiln::gguf::testing
