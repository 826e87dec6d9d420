// A block's drawn tiles: the device side of tile_counters.h. A kernel whose blocks run their own
// tiles first and then draw the rest from a per-launch counter keeps here, per block, which tile
// each drawn position of its sequence got. The draw is made by the first warp that looks the
// position up, so a block commits to a tile only when its weight requests reach it (the latest
// moment its request ring allows), and a block that runs late draws fewer.
#pragma once

#include <cstdint>

namespace kiln::cuda {

struct TileDraws {
  // Positions k of a block's sequence share slot k % kSlots; a slot is reused once every warp has
  // passed its position (the kernel's ring looks at most kSlots - 2 tiles ahead of its finished ones).
  static constexpr int kSlots = 8;
  // 2k: position k being drawn; 2k + 1: drawn, its tile in tile[] (-1: none left, the sequence ends).
  int state[kSlots];
  int tile[kSlots];

  // Before any lookup, by threads 0 .. kSlots - 1, then a __syncthreads.
  __device__ void init(int tid) {
    if (tid < kSlots) state[tid] = -1;
  }

  // Position k's tile, by one lane (the warp's lane 0; others wait on it): drawn now if no warp of
  // the block has, else read (waiting while another warp's draw is in flight). `counter`: the
  // launch's; `drawable` tiles follow the first `first` ones. Every block draws until it gets none,
  // so the launch makes drawable + gridDim.x draws and the last one zeroes the counter again.
  __device__ int lookup(uint32_t* counter, int k, int drawable, int first) {
    volatile int* st = state + k % kSlots;
    volatile int* tl = tile + k % kSlots;
    const int cur = *st;
    if (cur < 2 * k && atomicCAS(state + k % kSlots, cur, 2 * k) == cur) {
      const int v = int(atomicAdd(counter, 1u));
      if (v == drawable + int(gridDim.x) - 1) *counter = 0u;
      const int t = v < drawable ? first + v : -1;
      *tl = t;
      __threadfence_block();
      *st = 2 * k + 1;
      return t;
    }
    while (*st != 2 * k + 1) {
    }
    __threadfence_block();  // the tile was written before the state
    return *tl;
  }
};

}  // namespace kiln::cuda
