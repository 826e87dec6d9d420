// Writes a GGUF v3 file: metadata (any gguf::Value, e.g. copied from a file kiln read) and tensors
// (bytes the caller owns or borrows from a mapped input). Used by `kiln quantize`.
//
// The layout is ggml's: header, KV pairs, tensor infos, the data section at the alignment, each
// tensor's data at an aligned offset. Every tensor's byte size is checked against its type and
// shape before anything is written, and the file appears under its name only when complete
// (written to "<path>.tmp", then renamed).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/gguf/gguf_file.h"

namespace kiln::gguf {

class GgufWriter {
 public:
  void set(const std::string& key, Value value) { metadata_[key] = std::move(value); }
  void set_string(const std::string& key, std::string v);
  void set_u32(const std::string& key, uint32_t v);
  void set_bool(const std::string& key, bool v);
  void erase(const std::string& key) { metadata_.erase(key); }
  const std::map<std::string, Value>& metadata() const { return metadata_; }

  // `bytes` must stay alive until write(); ne[0] is the contiguous dimension.
  void add_tensor(std::string name, std::vector<uint64_t> ne, uint32_t type, std::span<const uint8_t> bytes);
  // The same, taking ownership of the bytes.
  void add_tensor(std::string name, std::vector<uint64_t> ne, uint32_t type, std::vector<uint8_t> bytes);

  // Writes everything; returns the bytes written.
  uint64_t write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::span<const uint8_t> bytes;
    std::shared_ptr<std::vector<uint8_t>> owned;
  };
  std::map<std::string, Value> metadata_;
  std::vector<Tensor> tensors_;
};

// F32 bytes of a float array, for add_tensor.
std::vector<uint8_t> f32_bytes(std::span<const float> values);

}  // namespace kiln::gguf
