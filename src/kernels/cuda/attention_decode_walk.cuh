// How the persistent decode kernels walk their (sequence, KV head) pairs and start their streams
// (device code; included by attention_decode_stream.cu and attention_decode_slices.cu): a worker --
// a block of the streaming kernel, a warp of the slice kernel -- takes pairs w, w + W, w + 2W, ...
// in (sequence, KV head) order, W the number of workers, each pair as ceil(length / kRows) tiles of
// kRows positions, through a ring of kSlots tiles of cp.async groups.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda::attn {

// Where a worker is in its stream: pair (b, kvh) at tile `tile` of its n_tiles; b >= batch once
// done. The next pair's length is loaded one pair ahead (next_len), so stepping to a pair never
// waits on a load, and (b, kvh) advance by the stride's quotient and remainder instead of a 64-bit
// division a tile (session 14: the division cost the first streaming kernel its gain).
struct StreamCursor {
  int b, kvh, tile, n_tiles, len, next_len;
};

template <int kRows>
struct StreamWalk {
  const int32_t* kv_len;
  int batch, n_kv_heads, step_b, step_h;  // the worker stride W as (sequences, KV heads)

  __device__ __forceinline__ StreamWalk(const int32_t* len, int batch_, int n_kv_heads_, int workers)
      : kv_len(len), batch(batch_), n_kv_heads(n_kv_heads_), step_b(workers / n_kv_heads_),
        step_h(workers % n_kv_heads_) {}

  __device__ __forceinline__ void step(int& b, int& kvh) const {
    kvh += step_h;
    b += step_b;
    if (kvh >= n_kv_heads) kvh -= n_kv_heads, ++b;
  }
  __device__ __forceinline__ int len_of(int b) const { return b < batch ? kv_len[b] : 0; }
  __device__ __forceinline__ StreamCursor start(int64_t j) const {
    StreamCursor c;
    c.b = int(j / n_kv_heads);
    c.kvh = int(j % n_kv_heads);
    c.tile = 0;
    c.len = len_of(c.b);
    c.n_tiles = (c.len + kRows - 1) / kRows;
    int b2 = c.b, h2 = c.kvh;
    step(b2, h2);
    c.next_len = len_of(b2);
    settle(c);
    return c;
  }
  // On to the next pair with a tile left (pairs of length 0 have none).
  __device__ __forceinline__ void settle(StreamCursor& c) const {
    while (c.b < batch && c.tile >= c.n_tiles) {
      step(c.b, c.kvh);
      c.tile = 0;
      c.len = c.next_len;
      c.n_tiles = (c.len + kRows - 1) / kRows;
      int b2 = c.b, h2 = c.kvh;
      step(b2, h2);
      c.next_len = len_of(b2);  // in flight until the cursor leaves this pair
    }
  }
};

// The cp.async copies of the cursor's tile of K and V into k_dst / v_dst (zero-filled past the pair's
// length), by the worker's kThreads copying threads (tid: this thread's index among them); kPaged:
// through `paged`'s block ids, fetched for this tile beforehand. skip_newest: the pair's newest
// position is not copied, when the tile holds it (load_newest_row copies it after pdl_wait).
template <int D, int kRows, int kThreads, bool kPaged>
__device__ __forceinline__ void load_kv_tile(const StreamCursor& rq, const KvLayout& kv,
                                             const PagedTileLoader<D, kRows, kThreads>& paged, bf16* k_dst,
                                             bf16* v_dst, int d, int tid, bool skip_newest = false) {
  const int b = rq.b, kvh = rq.kvh, k0 = rq.tile * kRows, n = min(kRows, rq.len - k0);
  const int skip = skip_newest && rq.tile == rq.n_tiles - 1 ? n - 1 : -1;
  if constexpr (kPaged) {
    paged.load(k_dst, v_dst, kv, kvh, k0, n, d, skip);
  } else {
    load_tile_async<D, kRows, kThreads>(
        k_dst, n, d, [&](int r) { return kv.k + kv.offset_as<false>(b, k0 + r, kvh); }, kv.k, tid, skip);
    load_tile_async<D, kRows, kThreads>(
        v_dst, n, d, [&](int r) { return kv.v + kv.offset_as<false>(b, k0 + r, kvh); }, kv.v, tid, skip);
  }
}

// The K and V rows at element offset `off` (kv.offset_as: computed before pdl_wait, so a paged
// lookup is not on the critical path) into row `row` of the swizzled tiles k_dst / v_dst (chunks at
// or past d zero-filled), by threads 0 .. 2 D / 8 - 1 of the worker: the one row
// load_kv_tile(skip_newest) left out.
template <int D>
__device__ __forceinline__ void load_newest_row(const KvLayout& kv, int64_t off, bf16* k_dst, bf16* v_dst, int row,
                                                int d, int tid) {
  constexpr int kChunks = D / 8;
  if (tid >= 2 * kChunks) return;
  const bool is_v = tid >= kChunks, ok = (tid % kChunks) * 8 < d;
  const int c = tid % kChunks;
  const bf16* base = is_v ? kv.v : kv.k;
  cp_async16((is_v ? v_dst : k_dst) + swz<D>(row, c), ok ? base + off + c * 8 : base, ok);
}

// A worker's ring before its loop: the first kSlots - 1 requests, around the PDL wait. q and the
// newest K/V row (the last position of each sequence) were written by the kernels before this one,
// so they load after pdl_wait; older K/V may load before it (pdl.cuh), overlapping the
// predecessor's tail as the split kernel's blocks do. When the worker's first kSlots - 1 tiles are
// older tiles of its first pair (`first`: the cursor before any request), they go before the wait
// and that pair's q after it, and the prologue waits for all of them (sync: the worker's barrier);
// otherwise everything goes after the wait. request(slot, with_q), load_q(slot, b, kvh): the kernel's.
// The dependent kernel may launch once this worker is past the wait (session 26 measured releasing
// it at the kernel's exit instead: tg128 int4 1.7% slower).
template <int kSlots, class Request, class LoadQ, class Sync>
__device__ __forceinline__ void stream_prologue(StreamCursor first, int batch, Request&& request, LoadQ&& load_q,
                                                Sync&& sync) {
  const bool early = first.b < batch && first.n_tiles > kSlots - 1;
  if (early) {
#pragma unroll
    for (int st = 0; st < kSlots - 1; ++st) request(st, false);
  }
  pdl_wait();
  pdl_launch_dependents();
  if (early) {
    load_q(0, first.b, first.kvh);
    cp_async_commit();
    cp_async_wait<0>();
    sync();
  } else {
#pragma unroll
    for (int st = 0; st < kSlots - 1; ++st) request(st, true);
  }
}

// stream_prologue's form for a first pair that fits the ring's first kSlots - 1 slots (a batch-1
// step at short context; DecodeStreamPrologue::early_rows): all of its tiles before the wait but
// the newest position, then q and that one row after it, both just written by the kernel before
// (L2). request(slot, with_q, skip_newest), load_q(slot, b, kvh), load_newest(slot): the kernel's;
// after_wait(): runs once the wait has returned (the kernel's trace).
template <int kSlots, class Request, class LoadQ, class LoadNewest, class Sync, class AfterWait>
__device__ __forceinline__ void stream_prologue_early_rows(StreamCursor first, Request&& request, LoadQ&& load_q,
                                                           LoadNewest&& load_newest, Sync&& sync,
                                                           AfterWait&& after_wait) {
  for (int st = 0; st < first.n_tiles; ++st) request(st, /*with_q=*/false, /*skip_newest=*/true);
  pdl_wait();
  after_wait();
  pdl_launch_dependents();
  load_q(0, first.b, first.kvh);
  load_newest(first.n_tiles - 1);
  cp_async_commit();
  cp_async_wait<0>();
  sync();
  for (int st = first.n_tiles; st < kSlots - 1; ++st) request(st, true, false);
}

// A worker's request of rq's tile into slot st as one cp.async group -- an empty one past the end,
// so the group count per iteration stays fixed -- with the pair's q when it is the pair's first
// tile (unless with_q is false: the prologue before pdl_wait loads it later); then rq moves on and
// fetch() gets the next tile's block ids, which land while this tile is computed.
// load_kv(st), load_q(st, b, kvh), fetch(): the kernel's.
template <int kRows, class LoadKv, class LoadQ, class Fetch>
__device__ __forceinline__ void stream_request(StreamCursor& rq, const StreamWalk<kRows>& walk, int batch, int st,
                                               bool with_q, LoadKv&& load_kv, LoadQ&& load_q, Fetch&& fetch) {
  if (rq.b < batch) {
    load_kv(st);
    if (rq.tile == 0 && with_q) load_q(st, rq.b, rq.kvh);
    ++rq.tile;
    walk.settle(rq);
    fetch();
  }
  cp_async_commit();
}

// A slice kernel's q load (one warp): the `group` query heads of pair (b, kvh), only those rows,
// into the swizzled slot qs; chunks at or past d zero-filled.
template <int D>
__device__ __forceinline__ void load_pair_q(bf16* qs, const bf16* q, int b, int kvh, int n_heads, int group, int d,
                                            int lane) {
  const bf16* qb = q + (int64_t(b) * n_heads + int64_t(kvh) * group) * d;
  for (int i = lane; i < group * (D / 8); i += 32) {
    const int r = i / (D / 8), c = i % (D / 8);
    const bool ok = c * 8 < d;
    cp_async16(qs + swz<D>(r, c), ok ? qb + r * d + c * 8 : q, ok);
  }
}

}  // namespace kiln::cuda::attn
