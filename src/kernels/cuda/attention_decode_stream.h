// The streaming decode attention for many sequences (attention_decode_stream.cu): one persistent
// grid whose blocks each run a continuous K/V stream over their (sequence, KV head) pairs, every
// pair whole in one block. attention_decode takes it where it would run one split block per pair
// (P = 1), the model's groups allow it and two of its blocks fit on a SM.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention.h"

namespace kiln::cuda {

// Whether the streaming kernel serves this head shape (at most 8 query heads per KV head).
bool decode_stream_applies(int n_heads, int n_kv_heads, int head_dim);

// Blocks of the streaming kernel that fit on one SM for this shape (attention_decode takes the
// kernel only where two do: one block a SM was never measured against the split kernel's two).
int decode_stream_blocks_per_sm(int n_heads, int n_kv_heads, int head_dim, bool paged);

// How a block starts its stream under PDL (DecodeTuning::early_rows, KILN_ATTN_EARLY_ROWS; on by
// default since session 26 measured it):
//   early_rows: when a block's first pair fits the ring's first slots (at most 128 positions), all
//     of its K/V but the newest position loads before pdl_wait, not after it (the split kernel, by
//     the same switch: all of its tile holding the newest position but that position).
struct DecodeStreamPrologue {
  bool early_rows = true;
};

// attention_decode's contract with every sequence whole in one block (no workspace, no combine).
void attention_decode_stream(const bf16* q, const KvLayout& kv, const int32_t* kv_len, bf16* out, int64_t batch,
                             int n_heads, int n_kv_heads, int head_dim, bool pdl, DecodeStreamPrologue prologue,
                             cudaStream_t stream);

}  // namespace kiln::cuda
