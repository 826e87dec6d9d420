// The batch-1 decode attention and the o projection as one kernel (attention_o_fused.cu), for int4
// o weights and a short cache: every block computes one KV head's attention (its group of query
// heads) and multiplies it by that head's columns of a slice of o's rows; the KV heads' partial
// products of a slice meet in a workspace, summed in a fixed order by the slice's last block and
// added into the residual. One launch and one PDL boundary instead of two.
//
// Why (docs/performance/decode-boundaries.md, session 29): the batch-1 int4 step spends ~16 µs a layer
// from the qkv GEMV's end to the o GEMV's end for ~0.5 MB of K/V and 8.4 MB of o weights, and
// leaving the attention kernel out of the step (KILN_DECODE_PROBE=1, logits wrong) made tg128 11%
// faster on an H100: its launch, its wait and the o GEMV's weight requests competing with its tiles
// are most of that time. Measured (H100): the fused kernel is slower at tg128 int4 (-5.2% in session
// 29, -1.4% in session 30), so the backend takes it only when asked (KILN_ATTN_O_FUSED=1). Its
// trace (KILN_ATTN_O_TRACE, session 30) puts 5.4 µs between a block's wait and its q and first tile
// in shared memory, where the separate attention lands q in 0.6: 256 blocks read their KV head's
// tiles (32 slices each) while the o weights stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/quant/qmatmul.h"

namespace kiln::cuda {

// At most this many cached positions (4 tiles of 64): the fused kernel streams them through two
// shared tiles; longer caches keep the separate kernels (which split the positions over blocks).
constexpr int64_t kAttnOMaxPositions = 256;

// The workspace: a partial product per (KV head, o row) and a counter per slice of rows, the
// counters zeroed once (each slice's last block zeroes its counter again, so graphs replay).
int64_t attention_o_partial_floats(int n_kv_heads, int64_t o_rows);
int64_t attention_o_counters(int64_t o_rows);
struct AttnOWorkspace {
  float* partials = nullptr;
  uint32_t* counters = nullptr;  // attention_o_counters of them, zeroed
};

// Whether the fused kernel takes this step: int4 o weights in groups of 128 (packed for qgemv,
// qmatmul.h), head_dim 128, at most 8 query heads per KV head, a contiguous bf16 cache (one
// sequence) of at most kAttnOMaxPositions positions, and two blocks fitting a SM.
bool attention_o_fusable(const QWeight& wo, int n_heads, int n_kv_heads, int head_dim, const KvLayout& kv,
                         int64_t max_kv_len);

// y (wo.rows, fp32) += wo . attention(q, cache) for one sequence: q (n_heads, head_dim) bf16, rotated;
// the cache holds kv_len[0] positions (device; the newest written by the kernel before). The
// attention output is rounded to bf16 before the product, as the separate kernels' is.
void attention_o_fused(const bf16* q, const KvLayout& kv, const int32_t* kv_len, const QWeight& wo, float* y,
                       const AttnOWorkspace& ws, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);

}  // namespace kiln::cuda
