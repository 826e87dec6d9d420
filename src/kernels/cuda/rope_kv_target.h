// Where a projection that applies RoPE itself puts its results: the fused qkv GEMV of a batch-1
// decode step (gemv_fused.h: one token) and the qkv GEMM with the RoPE epilogue (matmul.h's
// gemm_rope_kv: M tokens).
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda {

// RoPE's outputs: q_out (q_dim per token) bf16; K/V of the token at position[i] (device ints, one
// per token) into a contiguous single-sequence cache (sequence 0 of kv), or, with slot set, into
// row slot[i] of a paged pool (as rope_qkv_slots). inv_freq and the (cos, sin) table as for rope_qkv.
struct RopeKvTarget {
  const int32_t* position = nullptr;
  const int32_t* slot = nullptr;
  const float* inv_freq = nullptr;
  const float2* cos_sin = nullptr;  // rope_table_fill's table (may be null)
  int64_t cos_sin_positions = 0;
  int rot_dim = 0;
  bool interleaved = false;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bf16* q_out = nullptr;
  KvLayout kv;
};

}  // namespace kiln::cuda
