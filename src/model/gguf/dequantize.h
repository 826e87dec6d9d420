// Conversion of GGUF tensor data to fp32, block by block, as ggml defines each format.
#pragma once

#include <cstdint>

namespace kiln::gguf {

// True when dequantize_row handles this ggml type id.
bool can_dequantize(uint32_t type_id);

// Converts n elements (a multiple of the type's block size) starting at src into dst.
void dequantize_row(uint32_t type_id, const uint8_t* src, float* dst, int64_t n);

// Q4_K's 6-bit scale and min of sub-block j (0..7) from the block's 12 packed bytes.
void q4_k_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m);

}  // namespace kiln::gguf
