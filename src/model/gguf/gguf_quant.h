// The quantized form (model/quantized_matrix.h) of a GGUF weight tensor, for the kernels that run
// quantized weights natively.
//
//  * GGUF Q8_0 -> int8, group 32 (scale = d); Q4_0 -> int4, group 32 (scale = d, min = -8d); Q4_1 ->
//    int4, group 32 (scale = d, min = m); Q4_K -> int4, group 32 (scale = d * sc, min = -dmin * m).
//    Lossless: dequantizing the result gives bit for bit what gguf::dequantize_row gives (every
//    product of a fp16 scale with a 4- or 6-bit integer is exact in fp32).
//  * kiln's KILN_INT8/INT4/FP8 tensors with their "<name>.scales" (and ".mins") companions.
//  * Anything else (F32, F16, BF16, Q6_K...): nullopt, the matrix runs dense.
#pragma once

#include <optional>
#include <string>

#include "model/gguf/gguf_file.h"
#include "model/quantized_matrix.h"

namespace kiln::gguf {

// Metadata keys kiln writes into the GGUFs it quantizes.
inline constexpr const char* kQuantTypeKey = "kiln.quantization.type";        // int8|int4|fp8|bf16
inline constexpr const char* kQuantVersionKey = "kiln.quantization.version";  // u32, 1
inline constexpr const char* kQuantAwqKey = "kiln.quantization.awq";          // bool
inline constexpr const char* kQuantGptqKey = "kiln.quantization.gptq";        // bool: int4 codes through GPTQ
inline constexpr const char* kQuantHeadKey = "kiln.quantization.head";        // bool: output.weight quantized too
inline constexpr const char* kQuantHeadTypeKey = "kiln.quantization.head_type";  // string: its type
inline constexpr const char* kQuantTunedKey = "kiln.quantization.tuned";      // bool: --tune-epochs (quant/grid_tuning.h)
inline constexpr const char* kQuantRotatedKey = "kiln.quantization.rotated";  // bool: --rotate (quant/rotation.h)
inline constexpr const char* kQuantGroupKey = "kiln.quantization.group_size"; // u32, int4: --group

bool is_kiln_type(uint32_t type_id);

// `t` is the tensor of a (rows, cols) matrix whose shape the caller has checked. Throws
// kiln::Error(invalid_model) naming the tensor for a kiln tensor whose companions are missing or
// inconsistent, or that appears in a file without kiln.quantization.version 1.
std::optional<QuantizedMatrix> quantized_form(const GgufFile& f, const TensorInfo& t, int64_t rows, int64_t cols);

}  // namespace kiln::gguf
