// What the two flash-decoding split kernels share (attention_decode.cu for bf16 K/V,
// attention_decode_q8.cu for 8-bit K/V): how many split blocks a (KV head group, sequence) gets,
// and the combine kernel that merges the partials of the blocks that held data.
#pragma once

#include "kernels/cuda/attention.h"

namespace kiln::cuda {

constexpr int kMaxCombineSplits = 4096;  // the combine keeps one weight per split in shared memory

// Split blocks per (KV head group, sequence): enough for `waves` waves of `resident_blocks` at
// lengths near the capacity (at shorter lengths the blocks past the last 64-position tile exit),
// at most the workspace's splits.
int decode_split_count(int64_t resident_blocks, int waves, int64_t pairs, int ws_splits);

// The combine after a split kernel of P blocks per group (interleaved or contiguous 64-position
// tiles, as decode_split in attention_decode.cu): grid (n_heads, batch), 128 threads, launched
// with programmatic dependent launch when `pdl` (it waits for the split kernel's partials). Not
// launched at all when P = 1 (the split kernel wrote every output; KILN_ATTN_SKIP_P1_COMBINE=0
// launches it anyway, for comparison).
void launch_decode_combine(DecodeWorkspace ws, const int32_t* kv_len, bf16* out, int64_t batch, int n_heads,
                           int head_dim, int ws_splits, int P, bool interleave, bool pdl, cudaStream_t stream);

}  // namespace kiln::cuda
