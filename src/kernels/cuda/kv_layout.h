// Where a key or value vector lives in the cache: the one place that knows the KV addressing.
// Today each sequence's cache is contiguous per layer, (capacity, n_kv_heads, head_dim) for K and
// the same for V, and a batch of sequences is `seq_stride` elements apart. Paging (the batching
// issue) replaces offset() with a block-table lookup; every kernel goes through it.
#pragma once

#include "kernels/cuda/common.h"

namespace kiln::cuda {

struct KvLayout {
  bf16* k = nullptr;         // this layer's keys of sequence 0
  bf16* v = nullptr;         // this layer's values of sequence 0
  int64_t seq_stride = 0;    // elements from one sequence's cache to the next (batched decode)
  int64_t pos_stride = 0;    // elements from one position to the next (= n_kv_heads * head_dim)
  int head_dim = 0;

  KILN_HD int64_t offset(int seq, int64_t pos, int kv_head) const {
    return int64_t(seq) * seq_stride + pos * pos_stride + int64_t(kv_head) * head_dim;
  }
};

}  // namespace kiln::cuda
