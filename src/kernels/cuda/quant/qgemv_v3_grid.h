// How qgemv v3 (qgemv_v3.cu) lays a launch over the GPU: block widths, shared-memory budgets and
// how many tiles a block runs of its own before it draws the rest (host side).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/env.h"
#include "model/quantized_matrix.h"

namespace kiln::cuda {

// Shared-memory budget of one block: a grid of 4-warp blocks wants 4 per SM, of 8-warp blocks 2.
constexpr int64_t kSmemBudget4 = 52 * 1024, kSmemBudget8 = 100 * 1024;

// KILN_QGEMV_DEAL: how many tiles a block runs of its own before it draws the rest (qgemv_v3_kernel's
// deal), or 0: dealt evenly in advance. Evenly dealt, a launch whose tiles do not divide over its
// blocks runs the late ones' last tiles in a tail (int4 gate/up, session 27: 208 of 528 blocks run 4
// tiles, the others 3, and blocks on the SM of the RMSNorm before start 3.3 µs late). A block's
// requests before the wait reach D items into its sequence and must stay in its own tiles:
// own > D / items per warp and tile.
// KILN_QGEMV_DEAL=0: none draws. KILN_QGEMV_DEAL_OWN=n runs n of its own (at most the even share,
// at least that bound).
inline int v3_own_tiles(int64_t super_chunks, int warps, int depth, int per, bool uneven) {
  static const bool on = env_switch_on("KILN_QGEMV_DEAL");
  static const int own_set = env_int("KILN_QGEMV_DEAL_OWN", 0);
  const int64_t items = super_chunks / warps;  // the fewest of a warp per tile
  if (!on || !uneven || items == 0) return 0;
  const int least = int(depth / items) + 1;
  const int own = std::max(least, std::min(own_set, per));
  return own <= per ? own : 0;
}

// 8-warp blocks for every grid (qgemv_v3.cu picks them anyway for grids of at most two blocks a
// SM): a tile then takes half the time, so a launch's tail of drawn tiles is half as long, but the
// blocks stream a little slower (int4 gate/up in the step: the exits' spread 3.3 -> 1.8 µs, their
// median 1.5 µs later). H100, session 28: tg128 int8 + head +0.9 / +1.2%, int4 + head -1.4% (same
// calls): on by default for int8 at M = 1, the only case measured faster.
// KILN_QGEMV_WIDE=0: never; 1: every format and M.
inline bool v3_wide_blocks(QuantFormat f, int m) {
  static const int set = env_int("KILN_QGEMV_WIDE", -1);
  return set == 1 || (set < 0 && f == QuantFormat::int8 && m == 1);
}

}  // namespace kiln::cuda
