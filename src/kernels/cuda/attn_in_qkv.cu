// attn_in_qkv.h's host check (the device side: rope_kv_attn_epilogue.cuh, attention_group_tail.cuh).
#include "kernels/cuda/attn_in_qkv.h"

#include "kernels/cuda/attention_group_tail.cuh"

namespace kiln::cuda {

bool attn_in_qkv_applies(int n_heads, int n_kv_heads, int head_dim, const KvLayout& kv, int64_t max_kv_len) {
  if (head_dim != attn::kGroupTailD || n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return false;
  if (n_heads / n_kv_heads > attn::kGroupTailQRows) return false;
  if (max_kv_len < 1 || max_kv_len > kAttnInQkvMaxPositions) return false;
  return !kv.paged() && kv.quant == KvQuant::none && attn::kv_fast_ok(kv);
}

}  // namespace kiln::cuda
