#include "model/gguf/ggml_types.h"

namespace kiln::gguf {

std::optional<TypeTraits> type_traits(uint32_t type_id) {
  switch (GgmlType(type_id)) {
    case GgmlType::F32: return TypeTraits{"F32", 1, 4};
    case GgmlType::F16: return TypeTraits{"F16", 1, 2};
    case GgmlType::Q4_0: return TypeTraits{"Q4_0", 32, 18};
    case GgmlType::Q4_1: return TypeTraits{"Q4_1", 32, 20};
    case GgmlType::Q5_0: return TypeTraits{"Q5_0", 32, 22};
    case GgmlType::Q5_1: return TypeTraits{"Q5_1", 32, 24};
    case GgmlType::Q8_0: return TypeTraits{"Q8_0", 32, 34};
    case GgmlType::Q8_1: return TypeTraits{"Q8_1", 32, 36};
    case GgmlType::Q2_K: return TypeTraits{"Q2_K", 256, 84};
    case GgmlType::Q3_K: return TypeTraits{"Q3_K", 256, 110};
    case GgmlType::Q4_K: return TypeTraits{"Q4_K", 256, 144};
    case GgmlType::Q5_K: return TypeTraits{"Q5_K", 256, 176};
    case GgmlType::Q6_K: return TypeTraits{"Q6_K", 256, 210};
    case GgmlType::Q8_K: return TypeTraits{"Q8_K", 256, 292};
    case GgmlType::I8: return TypeTraits{"I8", 1, 1};
    case GgmlType::I16: return TypeTraits{"I16", 1, 2};
    case GgmlType::I32: return TypeTraits{"I32", 1, 4};
    case GgmlType::I64: return TypeTraits{"I64", 1, 8};
    case GgmlType::F64: return TypeTraits{"F64", 1, 8};
    case GgmlType::BF16: return TypeTraits{"BF16", 1, 2};
    case GgmlType::KILN_INT8: return TypeTraits{"KILN_INT8", 1, 1};
    case GgmlType::KILN_INT4: return TypeTraits{"KILN_INT4", 2, 1};
    case GgmlType::KILN_FP8: return TypeTraits{"KILN_FP8", 1, 1};
  }
  return std::nullopt;
}

}  // namespace kiln::gguf
