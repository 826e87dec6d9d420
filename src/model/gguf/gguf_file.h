// A parsed GGUF file (v2 or v3): metadata key/values and tensor descriptors over the raw bytes.
//
// Parsing is strict and bounded: every count, length and offset is checked against the bytes that
// remain before anything is allocated, so a corrupt or hostile file costs at most O(file size)
// memory and yields a kiln::Error (invalid_model) that names the problem and the byte offset.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "model/gguf/ggml_types.h"

namespace kiln::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};

// One metadata value. Scalars keep their exact value in the field that fits their type;
// arrays of strings go to `strings`, numeric and bool arrays to `numbers`.
struct Value {
  ValueType type = ValueType::U8;
  ValueType array_type = ValueType::U8;  // element type when type == ARRAY
  int64_t i = 0;                         // signed integers and bool
  uint64_t u = 0;                        // unsigned integers
  double f = 0;                          // floats
  std::string str;
  std::vector<std::string> strings;
  std::vector<double> numbers;

  bool is_integer() const;
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] is the contiguous dimension
  uint32_t type = 0;         // ggml type id; type_traits(type) is always set after parsing
  uint64_t offset = 0;       // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the file's bytes

  std::string shape_string() const;
};

class GgufFile {
 public:
  // Maps and parses a file. The mapping lives as long as the GgufFile.
  static GgufFile open(const std::string& path);
  // Parses bytes the caller keeps alive (tests, the fuzzer).
  static GgufFile parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, Value, std::less<>>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed getters: nullopt when the key is absent; kiln::Error when present with the wrong type.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // accepts integers too
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  const std::vector<std::string>* get_string_array(std::string_view key) const;
  const std::vector<double>* get_number_array(std::string_view key) const;

 private:
  void parse_bytes(std::span<const uint8_t> bytes);

  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, Value, std::less<>> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kiln::gguf
