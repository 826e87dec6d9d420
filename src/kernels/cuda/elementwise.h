// Small memory-bound kernels of the forward pass: embedding gather, (fused add +) RMSNorm, RoPE
// with the K/V cache write, SwiGLU.
//
// Residual stream choice: fp32. The embedding gather writes fp32 rows, the o/down projections add
// into them in fp32 (OutMode::add_f32), and RMSNorm reads fp32 and writes the bf16 input of the next
// projection (in a batch-1 decode step over more than 256 cached positions the GEMVs around it do
// its work instead: gemv_fused.h, NormProduce / NormApply). The residual is (n, hidden) -- small next to the weights -- and keeping it fp32 keeps
// the GPU close to the fp32 CPU reference over many layers.
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda {

// out(n, hidden) fp32 = table[tokens[i]] (table (vocab, hidden) bf16). Token ids are trusted
// (validated on the host).
void embed_gather(const bf16* table, const int32_t* tokens, float* out, int64_t n, int64_t hidden,
                  cudaStream_t stream);

// Per row: if delta, x += delta (the fused residual add, written back to x); then
// out(rows, dim) bf16 = x / rms(x) * weight. fp32 statistics.
void rmsnorm(float* x, const float* delta, const bf16* weight, bf16* out, int64_t rows, int64_t dim, float eps,
             cudaStream_t stream);
// rmsnorm (no delta) with the next fp8 (W8A8) projection's activation quantization fused: the
// bf16 outputs rmsnorm would store, quantized per row as quant/qmatmul.h's fp8_quantize_rows does
// (q8 (rows, dim) e4m3 bytes, s8 one scale a row: the same bytes as the two kernels in sequence).
// out may be null (the bf16 row is then not stored). Rows of dim % 4 == 0 up to 4096 values, the
// rows rmsnorm runs in its 256-thread kernel (rmsnorm_fp8_fusable; not under KILN_RMSNORM_WIDE=0);
// elsewhere it returns false and launches nothing.
bool rmsnorm_fp8_fusable(int64_t dim);
bool rmsnorm_fp8(const float* x, const bf16* weight, bf16* out, uint8_t* q8, float* s8, int64_t rows, int64_t dim,
                 float eps, cudaStream_t stream);

// cos_sin(positions, rot_dim / 2) = (cos, sin) of position p at inverse frequency i: the RoPE
// angle table the rotations read (positions past it are computed on the fly, with the same bits).
void rope_table_fill(float2* cos_sin, int64_t positions, const float* inv_freq, int rot_dim, cudaStream_t stream);

// qkv(n, q_dim + 2 kv_dim) bf16, one token a row ([q | k | v], the fused projection's output).
// Rotates q and k of token t by positions[t] (inv_freq: rot_dim/2 floats, llama3 scaling already
// in them; interleaved pairs (2i, 2i+1), else (i, i + rot_dim/2)), writes q to q_out(n, q_dim),
// and k, v into the cache at (seq_ids ? seq_ids[t] : 0, positions[t]). A quantized cache
// (kv.quantized(), sequence 0 only) is written by rope_qkv_quant (kv_quant.h), this function's
// rotation followed by the 8-bit write; rope_qkv_slots forwards a quantized pool the same way.
void rope_qkv(const bf16* qkv, const int32_t* positions, const int32_t* seq_ids, int64_t n, const float* inv_freq,
              int rot_dim, bool interleaved, int n_heads, int n_kv_heads, int head_dim, bf16* q_out, KvLayout kv,
              cudaStream_t stream, const float2* cos_sin = nullptr, int64_t cos_sin_positions = 0);

// The paged form: the same rotation, and K/V of token t written by slot into the pool
// (pool.k/pool.v: this layer's (num_blocks + 1, block_size, n_kv_heads, head_dim) arrays, see
// kv_layout.h) at row slots[t] = block * block_size + position % block_size (the slot mapping,
// computed on the host from the block tables). The block table in `pool` is not used. From 64
// tokens on, with rot_dim == head_dim, head_dim % 16 == 0 and 16-byte aligned buffers, a
// vectorized kernel runs (bit-identical results; KILN_ROPE_VEC=0 turns it off).
void rope_qkv_slots(const bf16* qkv, const int32_t* positions, const int32_t* slots, int64_t n, const float* inv_freq,
                    int rot_dim, bool interleaved, int n_heads, int n_kv_heads, int head_dim, bf16* q_out, KvLayout pool,
                    cudaStream_t stream, const float2* cos_sin = nullptr, int64_t cos_sin_positions = 0);

// dst(n, dim) fp32 = src[rows[i]] (the rows whose logits are wanted, before the final norm).
void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t dim, cudaStream_t stream);

// gate_up(rows, 2 inter) bf16 = [gate | up] per row; out(rows, inter) = silu(gate) * up.
void silu_mul(const bf16* gate_up, bf16* out, int64_t rows, int64_t inter, cudaStream_t stream);

}  // namespace kiln::cuda
