// The slice decode attention for many sequences (attention_decode_slices.cu, session 16; its 8-bit
// form attention_decode_q8_slices.cu, session 23): a
// persistent grid whose every warp runs its own K/V stream over its (sequence, KV head) pairs in
// slices of 16 positions. attention_decode takes it where the streaming kernel would run, from
// kDecodeSlicesPairsPer8Warps pairs per 8 resident warps on (decode_slices_fit).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention.h"

namespace kiln::cuda {

// The slice kernel serves the streaming kernel's head shapes (decode_stream_applies: at most 8 query
// heads per KV head). How it fits one: its blocks per SM (attention_decode takes it only where two
// fit, as the streaming kernel) and its warps resident at once on the whole GPU.
struct DecodeSlicesFit {
  int blocks_per_sm = 0;
  int64_t resident_warps = 0;
};
DecodeSlicesFit decode_slices_fit(int n_heads, int n_kv_heads, int head_dim, bool paged);

// attention_decode takes the slice kernel from this many pairs per 8 resident warps on (1056 warps
// at Llama-3-8B's 32/8/128 on an H200: from 116 sequences, so the 128-sequence graph bucket takes
// it). Below it SM slots stay empty that the streaming kernel's blocks, 4 warps a pair, fill:
// session 16's lab had the slice kernel 9% / 2% slower at 0.48 / 0.73 pairs a warp (b=64 L=2048,
// b=96 L=512), 6% faster at 0.97 (b=128 L=512) and 6-27% faster from 1.9 on (b=256..2048).
constexpr int64_t kDecodeSlicesPairsPer8Warps = 7;

// attention_decode's contract with every sequence whole in one warp (no workspace, no combine).
void attention_decode_slices(const bf16* q, const KvLayout& kv, const int32_t* kv_len, bf16* out, int64_t batch,
                             int n_heads, int n_kv_heads, int head_dim, bool pdl, cudaStream_t stream);

// The same schedule over the 8-bit cache (attention_decode_q8_slices.cu, session 23): how it fits
// (zero blocks where it does not apply: more than 8 query heads per KV head, head_dim % 16 != 0),
// and the call. attention_decode_q8 takes it for fp8 caches by the bf16 kernel's rule
// (kDecodeSlicesPairsPer8Warps, two blocks a SM) for fp8 and int8 caches (KILN_ATTN_Q8_SLICES=0:
// never, 1: fp8 only; attention_decode_q8.cu). variant: 1 = 4 slots a warp at 2 blocks a SM,
// 2 = 3 slots at 3 blocks; 0 = kQ8SlicesDefaultVariant.
constexpr int kQ8SlicesDefaultVariant = 2;
DecodeSlicesFit decode_q8_slices_fit(KvQuant quant, int n_heads, int n_kv_heads, int head_dim, bool paged,
                                     int variant = 0);
void attention_decode_q8_slices(const bf16* q, const KvLayout& kv, const int32_t* kv_len, bf16* out, int64_t batch,
                                int n_heads, int n_kv_heads, int head_dim, bool pdl, cudaStream_t stream,
                                int variant = 0);

}  // namespace kiln::cuda
