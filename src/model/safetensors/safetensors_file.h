// A parsed safetensors file (huggingface/safetensors): u64 little-endian header size N, N bytes
// of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then
// the data; offsets are relative to the data start.
//
// Parsing is strict and bounded, like the GGUF reader: the header size is capped (100 MB) and
// checked against the file before anything is read; every tensor's byte size must equal
// product(shape) x dtype size (overflow checked); the tensors must tile the data exactly (no gap,
// no overlap, no trailing bytes); duplicate names, non-UTF-8 and non-object headers are refused.
// Every failure is kiln::Error(invalid_model) naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"

namespace kiln::safetensors {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

// The dtypes the format defines. kiln converts F32, F16 and BF16; the others parse (so a file
// with, say, an I64 buffer still validates) but reading them as float throws unsupported.
enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2 };

const char* dtype_name(DType t);
size_t dtype_size(DType t);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<uint64_t> shape;  // row-major, shape[0] outermost (PyTorch order)
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data start
  uint64_t n_elements = 0;
  const uint8_t* data = nullptr;  // into the file's bytes

  std::string shape_string() const;  // "[out, in]"
};

class SafetensorsFile {
 public:
  // Maps and parses a file; the mapping lives as long as the object.
  static SafetensorsFile open(const std::string& path);
  // Parses bytes the caller keeps alive. `label` names the bytes in errors.
  static SafetensorsFile parse(std::span<const uint8_t> bytes, const std::string& label = "<memory>");

  const std::string& label() const { return label_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;

 private:
  void parse_bytes(std::span<const uint8_t> bytes);

  MappedFile file_;
  std::string label_;
  std::vector<TensorInfo> tensors_;  // sorted by name
  std::map<std::string, std::string> metadata_;
};

// Converts a F32, F16 or BF16 tensor to fp32 (n_elements values into out); other dtypes throw
// kiln::Error(unsupported) naming the tensor and its dtype.
void to_f32(const TensorInfo& t, float* out, uint64_t first = 0, uint64_t count = UINT64_MAX);

// One model's tensors across one file or the shards named by model.safetensors.index.json.
class TensorSet {
 public:
  static TensorSet open_file(const std::string& path);
  // index.json: {"metadata": {...}, "weight_map": {tensor: "shard file name"}}. Every tensor in
  // the map must be in the shard it names; shard names must be plain file names in the same
  // folder; a tensor present in two shards is refused.
  static TensorSet open_index(const std::string& index_path);

  const TensorInfo* find(std::string_view name) const;
  std::vector<std::string> names() const;
  size_t n_files() const { return files_.size(); }

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, const TensorInfo*, std::less<>> by_name_;
};

}  // namespace kiln::safetensors
