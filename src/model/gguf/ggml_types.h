// ggml tensor types as GGUF stores them: ids, block sizes, and bytes per block.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::gguf {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
  // kiln's own weight formats (ids 1024..1039 reserved for kiln; docs/QUANTIZATION.md has the byte
  // layouts). The tensor holds QuantizedMatrix::q; its scales (and int4 mins) are F32 tensors named
  // "<name>.scales" / "<name>.mins" of ne = [groups, rows]. ggml does not know these ids, so
  // llama.cpp refuses such a file instead of misreading it.
  KILN_INT8 = 1024, KILN_INT4 = 1025, KILN_FP8 = 1026,
};

struct TypeTraits {
  std::string_view name;
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
};

// Traits of a type id read from a file; nullopt for ids kiln does not know (IQ*, TQ*, removed).
std::optional<TypeTraits> type_traits(uint32_t type_id);

}  // namespace kiln::gguf
