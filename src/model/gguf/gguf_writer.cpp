#include "model/gguf/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace kiln::gguf {
namespace {

// Buffered little-endian output that remembers a failed write.
class Out {
 public:
  explicit Out(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    KILN_CHECK(f_, io, "cannot create '{}'", path);
  }
  ~Out() {
    if (f_) std::fclose(f_);
  }
  void bytes(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) ok_ = false;
    written_ += n;
  }
  template <typename T>
  void put(T v) {
    bytes(&v, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[256] = {};
    while (written_ % alignment) bytes(zeros, std::min<uint64_t>(alignment - written_ % alignment, sizeof zeros));
  }
  void close() {
    ok_ = std::fclose(f_) == 0 && ok_;
    f_ = nullptr;
    KILN_CHECK(ok_, io, "writing '{}' failed (disk full?)", path_);
  }
  uint64_t written() const { return written_; }

 private:
  std::string path_;
  FILE* f_;
  bool ok_ = true;
  uint64_t written_ = 0;
};

void put_scalar(Out& o, ValueType t, const Value& v, double number, bool in_array) {
  auto i = [&] { return in_array ? int64_t(number) : v.i; };
  auto u = [&] { return in_array ? uint64_t(number) : v.u; };
  auto f = [&] { return in_array ? number : v.f; };
  switch (t) {
    case ValueType::U8: o.put<uint8_t>(uint8_t(u())); return;
    case ValueType::I8: o.put<int8_t>(int8_t(i())); return;
    case ValueType::U16: o.put<uint16_t>(uint16_t(u())); return;
    case ValueType::I16: o.put<int16_t>(int16_t(i())); return;
    case ValueType::U32: o.put<uint32_t>(uint32_t(u())); return;
    case ValueType::I32: o.put<int32_t>(int32_t(i())); return;
    case ValueType::U64: o.put<uint64_t>(u()); return;
    case ValueType::I64: o.put<int64_t>(i()); return;
    case ValueType::F32: o.put<float>(float(f())); return;
    case ValueType::F64: o.put<double>(f()); return;
    case ValueType::BOOL: o.put<uint8_t>(i() != 0); return;
    default: KILN_FAIL(internal, "put_scalar on a non-scalar type");
  }
}

void put_value(Out& o, const Value& v) {
  o.put<uint32_t>(uint32_t(v.type));
  if (v.type == ValueType::STRING) {
    o.str(v.str);
  } else if (v.type == ValueType::ARRAY) {
    o.put<uint32_t>(uint32_t(v.array_type));
    if (v.array_type == ValueType::STRING) {
      o.put<uint64_t>(v.strings.size());
      for (const auto& s : v.strings) o.str(s);
    } else {
      o.put<uint64_t>(v.numbers.size());
      for (double d : v.numbers) put_scalar(o, v.array_type, v, d, true);
    }
  } else {
    put_scalar(o, v.type, v, 0, false);
  }
}

}  // namespace

void GgufWriter::set_string(const std::string& key, std::string s) {
  Value v;
  v.type = ValueType::STRING;
  v.str = std::move(s);
  set(key, std::move(v));
}

void GgufWriter::set_u32(const std::string& key, uint32_t x) {
  Value v;
  v.type = ValueType::U32;
  v.u = x;
  v.i = int64_t(x);
  v.f = double(x);
  set(key, std::move(v));
}

void GgufWriter::set_bool(const std::string& key, bool b) {
  Value v;
  v.type = ValueType::BOOL;
  v.i = b;
  v.u = b;
  set(key, std::move(v));
}

void GgufWriter::add_tensor(std::string name, std::vector<uint64_t> ne, uint32_t type, std::span<const uint8_t> bytes) {
  const auto traits = type_traits(type);
  KILN_CHECK(traits.has_value(), internal, "tensor '{}': unknown type {}", name, type);
  KILN_CHECK(!name.empty() && name.size() <= 63, invalid_argument, "tensor name '{}' must be 1 to 63 bytes", name);
  KILN_CHECK(!ne.empty() && ne.size() <= 4, internal, "tensor '{}' has {} dimensions", name, ne.size());
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  KILN_CHECK(ne[0] % traits->block_elems == 0 && n / traits->block_elems * traits->block_bytes == bytes.size(),
             internal, "tensor '{}' ({}): {} bytes do not hold {} elements", name, traits->name, bytes.size(), n);
  for (const Tensor& t : tensors_) KILN_CHECK(t.name != name, internal, "tensor '{}' added twice", name);
  tensors_.push_back({std::move(name), std::move(ne), type, bytes, nullptr});
}

void GgufWriter::add_tensor(std::string name, std::vector<uint64_t> ne, uint32_t type, std::vector<uint8_t> bytes) {
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  add_tensor(std::move(name), std::move(ne), type, std::span<const uint8_t>(*owned));
  tensors_.back().owned = std::move(owned);
}

uint64_t GgufWriter::write(const std::string& path) const {
  uint64_t alignment = 32;
  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) alignment = it->second.u;
  KILN_CHECK(alignment && (alignment & (alignment - 1)) == 0, internal, "alignment {} is not a power of two",
             alignment);
  const std::string tmp = path + ".tmp";
  Out o(tmp);
  o.bytes("GGUF", 4);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(metadata_.size());
  for (const auto& [key, v] : metadata_) {
    o.str(key);
    put_value(o, v);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    o.str(t.name);
    o.put<uint32_t>(uint32_t(t.ne.size()));
    for (uint64_t d : t.ne) o.put<uint64_t>(d);
    o.put<uint32_t>(t.type);
    o.put<uint64_t>(offset);
    offset = (offset + t.bytes.size() + alignment - 1) / alignment * alignment;
  }
  o.pad_to(alignment);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    o.bytes(tensors_[i].bytes.data(), tensors_[i].bytes.size());
    if (i + 1 < tensors_.size()) o.pad_to(alignment);
  }
  const uint64_t total = o.written();
  o.close();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  KILN_CHECK(!ec, io, "cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  return total;
}

std::vector<uint8_t> f32_bytes(std::span<const float> values) {
  std::vector<uint8_t> out(values.size() * 4);
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

}  // namespace kiln::gguf
