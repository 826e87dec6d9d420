// The streaming decode attention for many sequences (attention_decode_stream.cu): one persistent
// grid whose blocks each run a continuous K/V stream over their (sequence, KV head) pairs, every
// pair whole in one block. attention_decode takes it where it would run one split block per pair
// (P = 1) and the model's groups allow it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention.h"

namespace kiln::cuda {

// Whether the streaming kernel serves this head shape (at most 8 query heads per KV head).
bool decode_stream_applies(int n_heads, int n_kv_heads, int head_dim);

// attention_decode's contract with every sequence whole in one block (no workspace, no combine).
// stages: 3 (the default; two blocks a SM at head dim 128) or 2 (three).
void attention_decode_stream(const bf16* q, const KvLayout& kv, const int32_t* kv_len, bf16* out, int64_t batch,
                             int n_heads, int n_kv_heads, int head_dim, int stages, bool pdl, cudaStream_t stream);

}  // namespace kiln::cuda
