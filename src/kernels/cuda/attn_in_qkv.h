// The batch-1 decode attention run inside the fused int8 / int4 qkv GEMV (qgemv_rope_kv), by the
// block that finishes the last of a KV head's tiles: one kernel and one PDL boundary a layer fewer.
//
// Why (docs/performance/decode-critical-path.md, session 27; decode-boundaries.md): at short contexts
// the int4 step spends ~2.4 µs a layer from the qkv GEMV's end to the attention's wait return and
// ~0.8 µs more until q and the newest K/V row land, for ~32 KB of K/V a KV head. The qkv GEMV's
// blocks each finish one 16-row tile of q, K or V; a KV head's query heads, K and V rows are
// (group + 2) * head_dim / 16 tiles (48 for Llama-3-8B), and their last block to finish (a counter
// per KV head) has everything that head's attention needs: it runs the streaming decode kernel's
// tiles and 4-warp merge itself (the same bf16 output bits) while the other heads' tiles finish. The
// other blocks move the head's older K/V into L2 before their PDL wait, so the last block reads L2.
// Session 29's attention inside the o projection (attention_o_fused.h) was slower: it computed each
// head's attention in 32 blocks beside the o matrix's stream; here each head's runs once, in one block.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda {

// At most this many cached positions: a block then runs at most 4 tiles of 64 positions, as the
// one-block decode attention (attention_decode at P = 1) does; longer caches keep that kernel.
constexpr int64_t kAttnInQkvMaxPositions = 256;

struct AttnInQkv {
  const int32_t* kv_len = nullptr;  // device, host-written before the step: the newest position + 1
  bf16* out = nullptr;              // (n_heads, head_dim): the o projection's input
  uint32_t* counters = nullptr;     // attn_in_qkv_counters of them, zero between launches
  float scale_log2 = 0.0f;          // softmax scale * log2(e): set by qgemv_rope_kv from head_dim
};

// Counter words of a model's launches (one a KV head; each head's last block zeroes its word again,
// so a graph replays).
inline int64_t attn_in_qkv_counters(int n_kv_heads) { return n_kv_heads; }

// Whether the fused qkv GEMV can run the attention of this step: head_dim 128, at most 8 query heads
// a KV head, a contiguous bf16 cache (one sequence) of at most kAttnInQkvMaxPositions positions,
// 16-byte aligned, and rows = (n_heads + 2 n_kv_heads) head_dim.
bool attn_in_qkv_applies(int n_heads, int n_kv_heads, int head_dim, const KvLayout& kv, int64_t max_kv_len);

}  // namespace kiln::cuda
