// The quantized KV cache (`--kv-cache int8|fp8`, kv_layout.h's quantized form): one byte per value
// and one fp32 scale per (token, KV head), the numerics of the CPU reference's
// quant::fake_quantize (docs/QUANTIZATION.md):
//   int8: scale = amax / 127, byte = clamp(rint(x / scale), -127, 127)
//   fp8:  scale = amax / 448, byte = e4m3(x * 448 / amax) (round to nearest even, saturating)
// over the head_dim values of each (token, KV head) vector; an all-zero vector gets scale 0.
//
// Who reads and writes it:
//   rope_qkv_quant   the K/V write (RoPE, then quantize); rope_qkv and rope_qkv_slots call it for a
//                    quantized layout;
//   attention_decode_q8 (attention.h) reads the 8-bit tiles directly (attention_decode calls it);
//   kv_dequantize    turns the cached positions of one sequence into a contiguous bf16 K/V
//                    scratch for the prefill kernel, and kv_dequantize_rows a batched step's
//                    prefill chunks at once into a compact bf16 paged pool for the varlen prefill
//                    (prefill is compute-bound: reading the cache once more in bf16 costs about 1%
//                    of a prefill chunk's attention; see docs/PERFORMANCE.md, session 5).
// Needs head_dim % 16 == 0 (16-byte rows of bytes for cp.async), which kv_quant_supported checks.
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda {

inline bool kv_quant_supported(int head_dim) { return head_dim % 16 == 0 && head_dim <= 128; }

// As rope_qkv (slots == nullptr: K/V of token t at position positions[t] of the contiguous
// sequence 0 of kv) or rope_qkv_slots (slots set: row slots[t] of a paged pool), into a quantized
// layout. q_out gets the rotated queries in bf16 exactly as rope_qkv writes them.
void rope_qkv_quant(const bf16* qkv, const int32_t* positions, const int32_t* slots, int64_t n,
                    const float* inv_freq, int rot_dim, bool interleaved, int n_heads, int n_kv_heads, int head_dim,
                    bf16* q_out, KvLayout kv, cudaStream_t stream, const float2* cos_sin = nullptr,
                    int64_t cos_sin_positions = 0);

// rope_qkv_quant's 16-byte-a-thread form for many tokens (kv_quant_vec.cu, session 23): the same
// bits; false (nothing launched) where it does not apply (partial rotation, a token's 16-byte items
// not a multiple of 32, unaligned rows). rope_qkv_quant takes it from 64 tokens on unless
// KILN_ROPE_QUANT_VEC=0 (rope_qkv_quant_vec_default; session 26: 2x the per-token kernel's rate).
bool rope_qkv_quant_vec(const bf16* qkv, const int32_t* positions, const int32_t* slots, int64_t n,
                        const float* inv_freq, int rot_dim, bool interleaved, int n_heads, int n_kv_heads,
                        int head_dim, bf16* q_out, KvLayout kv, cudaStream_t stream, const float2* cos_sin = nullptr,
                        int64_t cos_sin_positions = 0);
bool rope_qkv_quant_vec_default();

// Positions 0 .. n_pos - 1 of sequence `seq` (contiguous: sequence index; paged: block-table row)
// of a quantized layout -> k_out, v_out (n_pos, n_kv_heads, head_dim) bf16, value = byte * scale
// rounded to bf16.
void kv_dequantize(KvLayout kv, int64_t seq, int64_t n_pos, int n_kv_heads, bf16* k_out, bf16* v_out,
                   cudaStream_t stream);

// Block-table rows row0 .. row0 + n_rows - 1 of a quantized paged layout `src`, positions 0 ..
// ends[row] - 1 of each -> the bf16 paged layout `dst` (its own pool and block table, same row
// indices), value = byte * scale rounded to bf16 as kv_dequantize: the batched engine's prefill
// chunks of a step read one compact bf16 copy of their positions in one varlen attention launch
// (session 23; before, one kv_dequantize and one attention launch per chunk and layer). ends: device
// int32 per row; max_pos >= every ends[row].
void kv_dequantize_rows(const KvLayout& src, const KvLayout& dst, const int32_t* ends, int64_t row0, int64_t n_rows,
                        int64_t max_pos, int n_kv_heads, cudaStream_t stream);

// bf16 K (or V, with `values`) of n_seq contiguous sequences of n_pos positions, (n_seq, n_pos,
// n_kv_heads, head_dim) -> the contiguous quantized layout dst (kv_layout.h), with rope_qkv_quant's
// numerics: for the kernel lab and tests, which start from a bf16 cache.
void kv_quantize(const bf16* src, int64_t n_seq, int64_t n_pos, int n_kv_heads, KvLayout dst, bool values,
                 cudaStream_t stream);

}  // namespace kiln::cuda
