// Conversion of GGUF tensor data to fp32, block by block, as ggml defines each format.
#pragma once

#include <cstdint>

namespace kiln::gguf {

// True when dequantize_row handles this ggml type id.
bool can_dequantize(uint32_t type_id);

// Converts n elements (a multiple of the type's block size) starting at src into dst.
void dequantize_row(uint32_t type_id, const uint8_t* src, float* dst, int64_t n);

}  // namespace kiln::gguf
