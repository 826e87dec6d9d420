// One KV head's batch-1 decode attention run by a block of another kernel (device code): the fused
// qkv GEMV's block that finished the head's last tile (attn_in_qkv.h). The streaming decode kernel's
// arithmetic (attention_decode_stream.cu at one pair a block): 64-position tiles in shared memory,
// 16 keys a warp over 4 warps (attend_tile), the 4-warp merge, bf16 out: the same output bits.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda::attn {

constexpr int kGroupTailD = 128;  // head_dim
constexpr int kGroupTailQRows = 8;  // the largest group a q slot holds
// Shared memory: one K and one V tile, then the q slot; the merge area reuses the tiles once the last
// one is done (4 warps x group x (2 + D) floats: 16.4 KB at a group of 8, under the tiles' 32 KB).
constexpr int kGroupTailSmem = 2 * kTileKv * kGroupTailD * 2 + kGroupTailQRows * kGroupTailD * 2;

// Called by every thread of the block (it synchronizes the block, at least 4 warps): threads 0..127
// copy, warps 0..3 compute. q: (n_heads, D) rotated; the cache holds len >= 1 positions of sequence
// 0, all written and visible to this block; out: (n_heads, D). The tiles load one after the other:
// at <= 256 positions a head has at most 4, all in L2 when the callers prefetched them.
__device__ __forceinline__ void attend_group(const bf16* q, const KvLayout& kv, int len, int kvh, int group, bf16* out,
                                             float scale_log2, unsigned char* smem) {
  constexpr int D = kGroupTailD, T = kTileKv, kCopiers = 128;
  bf16* const ks = reinterpret_cast<bf16*>(smem);
  bf16* const vs = ks + T * D;
  bf16* const qs = vs + T * D;
  const int tid = int(threadIdx.x), warp = tid / 32;
  const bool copier = tid < kCopiers, worker = warp < 4;
  const int n_tiles = (len + T - 1) / T;
  auto load_tile = [&](int tile) {
    const int k0 = tile * T, n = min(T, len - k0);
    load_tile_async<D, T, kCopiers>(
        ks, n, D, [&](int r) { return kv.k + kv.offset_as<false>(0, k0 + r, kvh); }, kv.k, tid);
    load_tile_async<D, T, kCopiers>(
        vs, n, D, [&](int r) { return kv.v + kv.offset_as<false>(0, k0 + r, kvh); }, kv.v, tid);
  };
  static_assert(kGroupTailQRows * D / 8 == kCopiers, "one 16-byte piece of the q slot a copier");
  if (copier) {  // q (rows past the group zero), then the first tile: cp.async.cg reads L2, never a stale L1
    const int r = tid / (D / 8), c = tid % (D / 8);
    cp_async16(qs + swz<D>(r, c), r < group ? q + (int64_t(kvh) * group + r) * D + c * 8 : q, r < group);
    load_tile(0);
  }
  cp_async_commit();

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int key0 = warp * 16;
  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<0>();
    __syncthreads();  // the tile (and q) in shared memory for every thread
    if (worker) {
      const int visible_n = min(T, len - tile * T);
      if (visible_n >= T) {
        attend_tile_qslot<D, 16, false>(qs, ks, vs, key0, m, l, o, scale_log2, [](int, int) { return true; });
      } else if (key0 < visible_n) {
        attend_tile_qslot<D, 16, true>(qs, ks, vs, key0, m, l, o, scale_log2,
                                       [&](int, int key) { return key < visible_n; });
      }
    }
    __syncthreads();  // every warp done with the tiles (the next tile, or the merge area, overwrites them)
    if (tile + 1 < n_tiles) {
      if (copier) load_tile(tile + 1);
      cp_async_commit();
    }
  }
  float* const ms = reinterpret_cast<float*>(smem);
  float* const ls = ms + 4 * group;
  float* const os = ls + 4 * group;
  if (worker) store_warp_state<D>(ms, ls, os, group, m, l, o, scale_log2);
  __syncthreads();
  for (int i = tid; i < group * D; i += int(blockDim.x)) {
    const int r = i / D, c = i % D;
    const WarpMerge w = merge_warps<D>(ms, ls, os, group, r, c);
    out[(int64_t(kvh) * group + r) * D + c] = __float2bfloat16(w.num / w.den);
  }
}

}  // namespace kiln::cuda::attn
