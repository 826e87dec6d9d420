// The fused qkv GEMV's epilogue that also runs the step's attention (attn_in_qkv.h): RopeKvEpi's
// rows and stores, plus what qgemv_v3_kernel asks of it around its stream: the KV head's older K/V
// into L2 before the PDL wait, a count per finished tile, and the head's attention by the block
// whose tile completed the head.
#pragma once

#include "kernels/cuda/attention_group_tail.cuh"
#include "kernels/cuda/attn_in_qkv.h"
#include "kernels/cuda/gemv_epilogues.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {

struct RopeKvAttnEpi : RopeKvEpiT<false> {
  AttnInQkv attn;
  // Whether the o GEMV after this kernel may launch once this kernel's blocks are past their wait
  // (as every fused GEMV lets its successor), or only as they exit.
  bool release_early = true;

  // Tile b's KV head and its place among that head's (group + 2) * head_dim / 16 tiles: the group's
  // query heads, then its K head, then its V head (each head's tiles stay within it: rows() pairs
  // rows of one head).
  __device__ __forceinline__ void head_of(int64_t b, int& kvh, int& place) const {
    const int hd = o.head_dim, group = o.n_heads / o.n_kv_heads;
    const int h = int(16 * b / hd), u = int(16 * b - int64_t(h) * hd) / 16;
    int rank;
    if (h < o.n_heads) {
      kvh = h / group, rank = h - kvh * group;
    } else if (h < o.n_heads + o.n_kv_heads) {
      kvh = h - o.n_heads, rank = group;
    } else {
      kvh = h - o.n_heads - o.n_kv_heads, rank = group + 1;
    }
    place = rank * (hd / 16) + u;
  }
  __device__ __forceinline__ int tiles_per_head() const {
    return (o.n_heads / o.n_kv_heads + 2) * (o.head_dim / 16);
  }

  // Before the PDL wait, by every thread: tile b's block moves its share of the head's older K/V
  // (positions < len - 1; the newest is this launch's) into L2, a position every tiles_per_head:
  // 4 lines of 64 bf16 (K and V, two halves) by 4 threads. The length is host-written before the step.
  __device__ __forceinline__ void prefetch_head_kv(int64_t b) const {
    int kvh, place;
    head_of(b, kvh, place);
    const int len = __ldg(attn.kv_len), stride = tiles_per_head() * int(blockDim.x / 4);
    const int part = int(threadIdx.x % 4);
    for (int p = place + tiles_per_head() * int(threadIdx.x / 4); p < len - 1; p += stride)
      prefetch_l2((part & 2 ? o.kv.v : o.kv.k) + o.kv.offset_as<false>(0, p, kvh) + (part & 1) * 64);
  }

  // By thread 0 after tile b's stores are fenced and the block synchronized: counts the tile in; the
  // head's last tile returns its KV head (its counter zeroed for the next launch), else -1.
  __device__ __forceinline__ int count_tile(int64_t b) const {
    int kvh, place;
    head_of(b, kvh, place);
    if (atomicAdd(attn.counters + kvh, 1u) != uint32_t(tiles_per_head() - 1)) return -1;
    attn.counters[kvh] = 0u;
    return kvh;
  }

  // By every thread of the block that completed KV head kvh (after a __threadfence by each: the other
  // blocks' q / K / V stores, fenced before their counts, are seen through L2).
  __device__ __forceinline__ void attend(int kvh, unsigned char* smem) const {
    const int len = __ldg(attn.kv_len);
    attn::attend_group(o.q_out, o.kv, len, kvh, o.n_heads / o.n_kv_heads, attn.out, attn.scale_log2, smem);
  }
};

}  // namespace kiln::cuda
