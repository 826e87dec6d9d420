#include "model/safetensors/safetensors_file.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.h"
#include "core/dtype.h"
#include "model/safetensors/strict_json.h"

namespace kiln::safetensors {
namespace {

struct DTypeInfo {
  const char* name;
  DType type;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {"F64", DType::F64, 8},   {"F32", DType::F32, 4},         {"F16", DType::F16, 2},
    {"BF16", DType::BF16, 2}, {"I64", DType::I64, 8},         {"I32", DType::I32, 4},
    {"I16", DType::I16, 2},   {"I8", DType::I8, 1},           {"U64", DType::U64, 8},
    {"U32", DType::U32, 4},   {"U16", DType::U16, 2},         {"U8", DType::U8, 1},
    {"BOOL", DType::BOOL, 1}, {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
};

const DTypeInfo& info(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d;
  KILN_FAIL(internal, "safetensors dtype {} has no table entry", int(t));
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A JSON number that is a non-negative integer (nlohmann stores those as unsigned).
bool as_u64(const nlohmann::json& j, uint64_t& out) {
  if (!j.is_number_unsigned()) return false;
  out = j.get<uint64_t>();
  return true;
}

}  // namespace

const char* dtype_name(DType t) { return info(t).name; }
size_t dtype_size(DType t) { return info(t).size; }

std::string TensorInfo::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile(path);
  f.label_ = path;
  f.parse_bytes(f.file_.bytes());
  return f;
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes, const std::string& label) {
  SafetensorsFile f;
  f.label_ = label;
  f.parse_bytes(bytes);
  return f;
}

void SafetensorsFile::parse_bytes(std::span<const uint8_t> bytes) {
  const std::string& L = label_;
  KILN_CHECK(bytes.size() >= 8, invalid_model, "safetensors '{}': {} bytes is too short for the 8-byte header size", L,
             bytes.size());
  const uint64_t n = read_u64_le(bytes.data());
  KILN_CHECK(n <= kMaxHeaderBytes, invalid_model,
             "safetensors '{}': header size {} exceeds the 100 MB limit (corrupt, or not a safetensors file)", L, n);
  KILN_CHECK(n <= bytes.size() - 8, invalid_model,
             "safetensors '{}': the header ({} bytes) runs past the end of the file ({} bytes); truncated?", L, n,
             bytes.size());
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), size_t(n));
  nlohmann::json header = parse_strict_json(text, fmt::format("safetensors '{}': the header", L));
  KILN_CHECK(header.is_object(), invalid_model, "safetensors '{}': the header is a JSON {}, not an object", L,
             header.type_name());

  const uint8_t* data = bytes.data() + 8 + n;
  const uint64_t data_size = bytes.size() - 8 - n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      KILN_CHECK(v.is_object(), invalid_model, "safetensors '{}': __metadata__ is a {}, not an object of strings", L,
                 v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        KILN_CHECK(m.value().is_string(), invalid_model,
                   "safetensors '{}': __metadata__ entry '{}' is a {}; metadata values must be strings", L, m.key(),
                   m.value().type_name());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    KILN_CHECK(v.is_object(), invalid_model, "safetensors '{}': tensor '{}' is described by a {}, not an object", L,
               name, v.type_name());
    for (auto f = v.begin(); f != v.end(); ++f)
      KILN_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets", invalid_model,
                 "safetensors '{}': tensor '{}' has an unknown field '{}'", L, name, f.key());
    TensorInfo t;
    t.name = name;

    auto dt = v.find("dtype");
    KILN_CHECK(dt != v.end() && dt->is_string(), invalid_model, "safetensors '{}': tensor '{}' has no string 'dtype'",
               L, name);
    const std::string& dname = dt->get_ref<const std::string&>();
    const DTypeInfo* di = nullptr;
    for (const auto& d : kDTypes)
      if (dname == d.name) di = &d;
    KILN_CHECK(di != nullptr, unsupported, "safetensors '{}': tensor '{}' has dtype '{}', which kiln does not know", L,
               name, dname);
    t.dtype = di->type;

    auto shape = v.find("shape");
    KILN_CHECK(shape != v.end() && shape->is_array(), invalid_model,
               "safetensors '{}': tensor '{}' has no 'shape' array", L, name);
    KILN_CHECK(shape->size() <= 8, invalid_model, "safetensors '{}': tensor '{}' has {} dimensions (at most 8)", L,
               name, shape->size());
    uint64_t elems = 1;
    bool overflow = false;
    for (const auto& d : *shape) {
      uint64_t dim = 0;
      KILN_CHECK(as_u64(d, dim), invalid_model,
                 "safetensors '{}': tensor '{}' has a shape entry {} that is not a non-negative integer", L, name,
                 d.dump());
      t.shape.push_back(dim);
      overflow = overflow || __builtin_mul_overflow(elems, dim, &elems);
    }
    uint64_t expect_bytes = 0;
    overflow = overflow || __builtin_mul_overflow(elems, uint64_t(di->size), &expect_bytes);
    KILN_CHECK(!overflow, invalid_model,
               "safetensors '{}': tensor '{}' shape {} x {} bytes overflows 64 bits", L, name, t.shape_string(),
               di->size);
    t.n_elements = elems;

    auto offs = v.find("data_offsets");
    KILN_CHECK(offs != v.end() && offs->is_array() && offs->size() == 2 && as_u64((*offs)[0], t.begin) &&
                   as_u64((*offs)[1], t.end),
               invalid_model, "safetensors '{}': tensor '{}' needs 'data_offsets' as two non-negative integers", L,
               name);
    KILN_CHECK(t.begin <= t.end, invalid_model, "safetensors '{}': tensor '{}' has data_offsets [{}, {}] (end < begin)",
               L, name, t.begin, t.end);
    KILN_CHECK(t.end <= data_size, invalid_model,
               "safetensors '{}': tensor '{}' ends at byte {} of the data, past its end ({} bytes); truncated?", L, name,
               t.end, data_size);
    KILN_CHECK(t.end - t.begin == expect_bytes, invalid_model,
               "safetensors '{}': tensor '{}' has {} bytes but shape {} of {} needs {}", L, name, t.end - t.begin,
               t.shape_string(), di->name, expect_bytes);
    t.data = data + t.begin;
    tensors_.push_back(std::move(t));
  }

  // The tensors must tile [0, data_size) exactly: sorted by offset, each starts where the last ended.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_offset) {
    KILN_CHECK(t->begin >= pos, invalid_model, "safetensors '{}': tensor '{}' (bytes {}..{}) overlaps tensor '{}'", L,
               t->name, t->begin, t->end, prev ? prev->name : "");
    KILN_CHECK(t->begin == pos, invalid_model,
               "safetensors '{}': a gap of {} bytes before tensor '{}' (data_offsets must tile the data)", L,
               t->begin - pos, t->name);
    pos = t->end;
    prev = t;
  }
  KILN_CHECK(pos == data_size, invalid_model,
             "safetensors '{}': {} trailing bytes after the last tensor (data_offsets must tile the data)", L,
             data_size - pos);
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

void to_f32(const TensorInfo& t, float* out, uint64_t first, uint64_t count) {
  count = std::min(count, t.n_elements - std::min(first, t.n_elements));
  const uint8_t* p = t.data + first * dtype_size(t.dtype);
  switch (t.dtype) {
    case DType::F32:
      std::memcpy(out, p, count * 4);  // the data start need not be 4-byte aligned
      return;
    case DType::F16:
    case DType::BF16:
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = t.dtype == DType::BF16 ? bf16_to_f32(h) : fp16_to_f32(h);
      }
      return;
    default:
      KILN_FAIL(unsupported, "tensor '{}' has dtype {}; kiln loads F32, F16 and BF16 weights", t.name,
                dtype_name(t.dtype));
  }
}

TensorSet TensorSet::open_file(const std::string& path) {
  TensorSet s;
  s.files_.push_back(SafetensorsFile::open(path));
  for (const auto& t : s.files_.back().tensors()) s.by_name_[t.name] = &t;
  return s;
}

TensorSet TensorSet::open_index(const std::string& index_path) {
  namespace fs = std::filesystem;
  nlohmann::json index = read_strict_json_file(index_path);
  KILN_CHECK(index.is_object(), invalid_model, "'{}' is not a JSON object", index_path);
  auto wm = index.find("weight_map");
  KILN_CHECK(wm != index.end() && wm->is_object() && !wm->empty(), invalid_model,
             "'{}' has no 'weight_map' object naming each tensor's shard", index_path);
  // Shard name -> the tensors the index puts there, in first-seen order of shards.
  std::map<std::string, std::vector<std::string>> wanted;
  std::vector<std::string> order;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    KILN_CHECK(it.value().is_string(), invalid_model, "'{}': weight_map['{}'] is a {}, not a file name", index_path,
               it.key(), it.value().type_name());
    const std::string& shard = it.value().get_ref<const std::string&>();
    KILN_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard.find('\\') == std::string::npos &&
                   shard != "." && shard != "..",
               invalid_model, "'{}': shard name '{}' must be a plain file name in the same folder", index_path, shard);
    auto [w, inserted] = wanted.try_emplace(shard);
    if (inserted) order.push_back(shard);
    w->second.push_back(it.key());
  }
  TensorSet s;
  fs::path dir = fs::path(index_path).parent_path();
  for (const std::string& shard : order) {
    std::string path = (dir / shard).string();
    KILN_CHECK(fs::exists(path), io, "'{}' names shard '{}', which does not exist", index_path, path);
    s.files_.push_back(SafetensorsFile::open(path));
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const SafetensorsFile& f = s.files_[i];
    for (const auto& t : f.tensors()) {
      auto [it, inserted] = s.by_name_.try_emplace(t.name, &t);
      KILN_CHECK(inserted, invalid_model, "tensor '{}' is in two shards, '{}' and another; which one is meant?", t.name,
                 f.label());
    }
    for (const std::string& name : wanted[order[i]])
      KILN_CHECK(f.find(name) != nullptr, invalid_model, "'{}' puts tensor '{}' in '{}', which does not hold it",
                 index_path, name, f.label());
  }
  return s;
}

const TensorInfo* TensorSet::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> TensorSet::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : by_name_) out.push_back(n);
  return out;
}

}  // namespace kiln::safetensors
