#include "model/gguf/gguf_file.h"

#include <cstring>
#include <limits>
#include <utility>

#include "core/check.h"

namespace kiln::gguf {
namespace {

constexpr uint32_t kMaxDims = 4;            // GGML_MAX_DIMS
constexpr uint64_t kMaxTensorName = 63;     // GGML_MAX_NAME - 1
constexpr uint64_t kMaxKeyLength = 65535;   // a key is an identifier, not a payload
constexpr int kMaxArrayNesting = 1;         // llama.cpp writes no nested arrays

// Reads little-endian values from a byte span; every read is bounds-checked and failures
// name the byte offset so a bad file can be inspected with a hex dump.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t offset() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  T read(const char* what) {
    KILN_CHECK(remaining() >= sizeof(T), invalid_model,
               "GGUF truncated: {} at byte {} needs {} bytes, {} remain", what, pos_, sizeof(T), remaining());
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string(const char* what, uint64_t max_length) {
    uint64_t start = pos_;
    uint64_t length = read<uint64_t>(what);
    KILN_CHECK(length <= remaining(), invalid_model,
               "GGUF truncated: {} at byte {} claims {} bytes, {} remain", what, start, length, remaining());
    KILN_CHECK(length <= max_length, invalid_model, "GGUF {} at byte {} is {} bytes long (limit {})", what,
               start, length, max_length);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one value of a type: bounds array counts before allocating.
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t t) { return t <= uint32_t(ValueType::F64); }

// Reads one scalar into `out` (numbers also into `number` for arrays).
void read_scalar(Cursor& c, ValueType t, Value& out, double* number) {
  auto set_int = [&](int64_t v) { out.i = v; out.u = uint64_t(v); out.f = double(v); if (number) *number = double(v); };
  auto set_uint = [&](uint64_t v) { out.u = v; out.i = int64_t(v); out.f = double(v); if (number) *number = double(v); };
  switch (t) {
    case ValueType::U8: set_uint(c.read<uint8_t>("u8 value")); break;
    case ValueType::I8: set_int(c.read<int8_t>("i8 value")); break;
    case ValueType::U16: set_uint(c.read<uint16_t>("u16 value")); break;
    case ValueType::I16: set_int(c.read<int16_t>("i16 value")); break;
    case ValueType::U32: set_uint(c.read<uint32_t>("u32 value")); break;
    case ValueType::I32: set_int(c.read<int32_t>("i32 value")); break;
    case ValueType::U64: set_uint(c.read<uint64_t>("u64 value")); break;
    case ValueType::I64: set_int(c.read<int64_t>("i64 value")); break;
    case ValueType::F32: out.f = c.read<float>("f32 value"); if (number) *number = out.f; break;
    case ValueType::F64: out.f = c.read<double>("f64 value"); if (number) *number = out.f; break;
    case ValueType::BOOL: {
      uint64_t at = c.offset();
      uint8_t b = c.read<uint8_t>("bool value");
      KILN_CHECK(b <= 1, invalid_model, "GGUF bool at byte {} has value {}", at, b);
      set_int(b);
      break;
    }
    default: KILN_FAIL(internal, "read_scalar on a non-scalar type");
  }
}

Value read_value(Cursor& c, ValueType t, const std::string& key, int depth) {
  Value v;
  v.type = t;
  if (t == ValueType::STRING) {
    v.str = c.read_string("string value", std::numeric_limits<uint64_t>::max());
  } else if (t == ValueType::ARRAY) {
    uint64_t at = c.offset();
    uint32_t elem = c.read<uint32_t>("array element type");
    KILN_CHECK(valid_value_type(elem), invalid_model, "GGUF key '{}': unknown array element type {} at byte {}",
               key, elem, at);
    KILN_CHECK(ValueType(elem) != ValueType::ARRAY || depth < kMaxArrayNesting, invalid_model,
               "GGUF key '{}': nested arrays are not supported", key);
    KILN_CHECK(ValueType(elem) != ValueType::ARRAY, unsupported, "GGUF key '{}': nested arrays are not supported",
               key);
    v.array_type = ValueType(elem);
    uint64_t count = c.read<uint64_t>("array length");
    KILN_CHECK(count <= c.remaining() / min_encoded_size(v.array_type), invalid_model,
               "GGUF key '{}': array of {} elements at byte {} cannot fit in the {} bytes that remain", key, count,
               at, c.remaining());
    if (v.array_type == ValueType::STRING) {
      v.strings.reserve(count);
      for (uint64_t k = 0; k < count; ++k) v.strings.push_back(c.read_string("array string", c.remaining()));
    } else {
      v.numbers.resize(count);
      Value scratch;
      for (uint64_t k = 0; k < count; ++k) read_scalar(c, v.array_type, scratch, &v.numbers[k]);
    }
  } else {
    read_scalar(c, t, v, nullptr);
  }
  return v;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

}  // namespace

bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64: return true;
    default: return false;
  }
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t d = 0; d < ne.size(); ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
  return s + "]";
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.file_ = MappedFile(path);
  try {
    f.parse_bytes(f.file_.bytes());
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", path, e.what()));
  }
  return f;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufFile f;
  f.parse_bytes(bytes);
  return f;
}

void GgufFile::parse_bytes(std::span<const uint8_t> bytes) {
  Cursor c(bytes);
  KILN_CHECK(bytes.size() >= 4 && std::memcmp(bytes.data(), "GGUF", 4) == 0, invalid_model,
             "not a GGUF file (the first 4 bytes are not 'GGUF')");
  c.read<uint32_t>("magic");
  version_ = c.read<uint32_t>("version");
  KILN_CHECK(version_ != 1, unsupported, "GGUF version 1 is obsolete; convert the model again with llama.cpp");
  KILN_CHECK(version_ == 2 || version_ == 3, invalid_model, "GGUF version {} is unknown (kiln reads 2 and 3)",
             version_);
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each KV pair takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at least
  // 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
  KILN_CHECK(n_kv <= c.remaining() / 13, invalid_model, "GGUF claims {} metadata entries; the file is too small",
             n_kv);
  KILN_CHECK(n_tensors <= c.remaining() / 32, invalid_model, "GGUF claims {} tensors; the file is too small",
             n_tensors);

  for (uint64_t k = 0; k < n_kv; ++k) {
    uint64_t at = c.offset();
    std::string key = c.read_string("metadata key", kMaxKeyLength);
    KILN_CHECK(!key.empty(), invalid_model, "GGUF metadata key {} at byte {} is empty", k, at);
    uint32_t type = c.read<uint32_t>("metadata type");
    KILN_CHECK(valid_value_type(type), invalid_model, "GGUF key '{}' has unknown value type {}", key, type);
    Value v = read_value(c, ValueType(type), key, 0);
    KILN_CHECK(!metadata_.contains(key), invalid_model, "GGUF key '{}' appears twice", key);
    metadata_.emplace(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    KILN_CHECK(a->type == ValueType::U32, invalid_model, "general.alignment must be a u32");
    KILN_CHECK(a->u != 0 && (a->u & (a->u - 1)) == 0, invalid_model,
               "general.alignment is {}; it must be a power of two", a->u);
    alignment_ = a->u;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    TensorInfo info;
    uint64_t at = c.offset();
    info.name = c.read_string("tensor name", kMaxTensorName);
    KILN_CHECK(!info.name.empty(), invalid_model, "tensor {} at byte {} has an empty name", t, at);
    uint32_t n_dims = c.read<uint32_t>("tensor n_dims");
    KILN_CHECK(n_dims >= 1 && n_dims <= kMaxDims, invalid_model, "tensor '{}' has {} dimensions (1 to {} allowed)",
               info.name, n_dims, kMaxDims);
    info.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t n = c.read<uint64_t>("tensor dimension");
      KILN_CHECK(n >= 1, invalid_model, "tensor '{}' has dimension {} of size 0", info.name, d);
      KILN_CHECK(checked_mul(info.n_elements, n, info.n_elements) &&
                     info.n_elements <= uint64_t(std::numeric_limits<int64_t>::max()),
                 invalid_model, "tensor '{}': element count overflows", info.name);
      info.ne.push_back(n);
    }
    info.type = c.read<uint32_t>("tensor type");
    auto traits = type_traits(info.type);
    KILN_CHECK(traits.has_value(), invalid_model, "tensor '{}' has unknown ggml type {}", info.name, info.type);
    KILN_CHECK(info.ne[0] % traits->block_elems == 0, invalid_model,
               "tensor '{}' ({}): row length {} is not a multiple of the {} block size {}", info.name,
               traits->name, info.ne[0], traits->name, traits->block_elems);
    KILN_CHECK(checked_mul(info.n_elements / traits->block_elems, traits->block_bytes, info.n_bytes),
               invalid_model, "tensor '{}': byte size overflows", info.name);
    info.offset = c.read<uint64_t>("tensor offset");
    KILN_CHECK(info.offset % alignment_ == 0, invalid_model, "tensor '{}': offset {} is not a multiple of the alignment {}",
               info.name, info.offset, alignment_);
    KILN_CHECK(!tensor_index_.contains(info.name), invalid_model, "tensor '{}' appears twice", info.name);
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  uint64_t data_start = (c.offset() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors == 0) return;
  KILN_CHECK(data_start <= bytes.size(), invalid_model, "GGUF truncated: the data section would start at byte {}, past the end ({})",
             data_start, bytes.size());
  uint64_t data_size = bytes.size() - data_start;
  for (auto& info : tensors_) {
    KILN_CHECK(info.offset <= data_size && info.n_bytes <= data_size - info.offset, invalid_model,
               "tensor '{}' ({} bytes at data offset {}) lies past the end of the file (data section is {} bytes)",
               info.name, info.n_bytes, info.offset, data_size);
    info.data = bytes.data() + data_start + info.offset;
  }
}

const Value* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  KILN_CHECK(v->is_integer(), invalid_model, "GGUF key '{}' should be an integer", key);
  KILN_CHECK(v->type != ValueType::U64 || v->u <= uint64_t(std::numeric_limits<int64_t>::max()), invalid_model,
             "GGUF key '{}' is out of range", key);
  return v->i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  KILN_CHECK(v->is_float() || v->is_integer(), invalid_model, "GGUF key '{}' should be a number", key);
  return v->f;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  KILN_CHECK(v->type == ValueType::BOOL, invalid_model, "GGUF key '{}' should be a bool", key);
  return v->i != 0;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  KILN_CHECK(v->type == ValueType::STRING, invalid_model, "GGUF key '{}' should be a string", key);
  return v->str;
}

const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return nullptr;
  KILN_CHECK(v->type == ValueType::ARRAY && v->array_type == ValueType::STRING, invalid_model,
             "GGUF key '{}' should be an array of strings", key);
  return &v->strings;
}

const std::vector<double>* GgufFile::get_number_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return nullptr;
  KILN_CHECK(v->type == ValueType::ARRAY && v->array_type != ValueType::STRING, invalid_model,
             "GGUF key '{}' should be an array of numbers", key);
  return &v->numbers;
}

}  // namespace kiln::gguf
