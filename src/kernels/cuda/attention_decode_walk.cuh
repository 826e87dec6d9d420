// How the persistent decode kernels walk their (sequence, KV head) pairs (device code; included by
// attention_decode_stream.cu and attention_decode_slices.cu): a worker -- a block of the streaming
// kernel, a warp of the slice kernel -- takes pairs w, w + W, w + 2W, ... in (sequence, KV head)
// order, W the number of workers, each pair as ceil(length / kRows) tiles of kRows positions.
#pragma once

#include <cstdint>

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

}  // namespace kiln::cuda::attn
