// Quantizing a model's matrices to a target type: what `kiln quantize` does to each linear weight
// (q, k, v, o, gate, up, down of every layer; embeddings, norms and the output head are kept).
#pragma once

#include <string_view>

#include "model/weights.h"

namespace kiln::quant {

// bf16: the weights rounded to bf16 (the reference the other formats are measured against);
// int8 / int4 / fp8 as quantize.h defines them.
enum class TargetType { bf16, int8, int4, fp8 };
// kiln::Error(invalid_argument) naming the valid types for anything else.
TargetType parse_target_type(std::string_view name);
std::string_view target_name(TargetType t);

// Replaces m in place: bf16 rounds m.data and clears m.quant; the others set m.quant to the
// quantized form of m.data and m.data to its dequantization (so the CPU computes what the file
// holds). kiln::Error(unsupported) when int4 cannot group the rows (length not a multiple of 32).
// int4_group: the preferred int4 group (quantize.h's int4_group_for).
void quantize_matrix(HostMatrix& m, TargetType t, int64_t int4_group = 128);

}  // namespace kiln::quant
