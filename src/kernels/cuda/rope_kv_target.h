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
// A quantized cache's staging for the fused qkv GEMV (session 37): a (token, KV head) vector's scale
// needs the amax of all its head_dim values, which that GEMV spreads over head_dim / 16 blocks. Each
// block stages its 16 values (fp32, as rotated) in `values` (2 kv_dim: K then V), raises the head's
// amax (sync[0 .. 2 n_kv_heads), float bits) and counts itself in (sync[2 n_kv_heads ..)); the
// head's last block encodes the vector and resets both words, so a graph replays it.
struct KvQuantStage {
  float* values = nullptr;
  uint32_t* sync = nullptr;  // 4 n_kv_heads words, zero between launches
};

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
  KvQuantStage q8;  // the fused qkv GEMV into a quantized cache only
};

}  // namespace kiln::cuda
