// Decode GEMVs (one token, M = 1, bf16 weights) with the pointwise kernel after them folded into
// their epilogue, so a layer of a batch-1 decode step is 7 kernels instead of 9:
//   gemv_rope_kv: qkv projection -> RoPE -> q out, K/V into the cache (replaces qkv GEMV + rope_qkv)
//   gemv_swiglu:  gate/up projection -> silu(gate) * up              (replaces gate_up GEMV + silu_mul)
// How (gemv_mma.cuh's kernel with the row choice and the epilogue replaced): a block's 16 weight
// rows are two runs of 8 (rows g and g + 8 of its MMA tile), chosen so the two values a pointwise op
// needs meet in one warp: q/k rows i and i + rot_dim/2 of a head (RoPE's rotate-half pairs;
// interleaved pairs (2i, 2i+1) are neighbours already), gate row i and up row i. One shuffle brings
// the partner. Results are bit-identical to the unfused kernels (pointwise_math.cuh holds the
// shared arithmetic; the GPU tests compare the two paths bit for bit).
// A third variant, with the RMSNorm in front folded into a prologue (every block normalizing the
// fp32 residual row into shared memory), measured slower than the rmsnorm kernel it replaced and
// was dropped (docs/PERFORMANCE.md, session 4).
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda {

// Where RoPE's outputs go: q_out (q_dim) bf16; K/V of position *position (device int) into a
// contiguous single-sequence cache (sequence 0 of kv), or, with slot set, into row *slot of a
// paged pool (as rope_qkv_slots). inv_freq and the (cos, sin) table as for rope_qkv.
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

// Whether gemv_rope_kv takes this shape: head_dim and rot_dim multiples of 16 (a block's 16 rows
// never straddle a head or the rotated part), K a multiple of 8.
bool gemv_rope_kv_fusable(int rot_dim, int head_dim, int64_t K);
// The fused qkv GEMV's checks of its target, bf16 and int8 / int4 alike: the shape above, K/V
// written by slot into a paged pool, and a bf16 cache (KILN_CUDA_REQUIRE). Returns the
// projection's rows, q_dim + 2 kv_dim.
int64_t require_rope_kv_target(const RopeKvTarget& out, int64_t K);

// x (K) bf16; w (q_dim + 2 kv_dim, K) = [wq | wk | wv] bf16, bias optional.
void gemv_rope_kv(const bf16* x, const bf16* w, const bf16* bias, const RopeKvTarget& out, int64_t K,
                  cudaStream_t stream);
// x (K) bf16; w (2 inter, K) = [w_gate | w_up]; h (inter) bf16 = silu(gate) * up. Needs inter % 8 == 0,
// K % 8 == 0.
void gemv_swiglu(const bf16* x, const bf16* w, bf16* h, int64_t inter, int64_t K, cudaStream_t stream);

}  // namespace kiln::cuda
