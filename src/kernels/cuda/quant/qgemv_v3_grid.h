// How qgemv v3 (qgemv_v3.cu) lays a launch over the GPU: block widths, shared-memory budgets, the ring
// depth, how many tiles a block runs of its own before it draws the rest, and the weight loads' L2 hints.
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

// KILN_QGEMV_L2_REST (a mask): which launches ask the rest of each warp's first tile into L2 before
// the PDL wait, beyond the D super-chunks they request into registers (qgemv_v3_kernel's l2_rest):
// 1 the qkv GEMV (RoPE epilogue), 2 other launches of one tile a block (o, down), 4 launches of
// several tiles a block (gate/up, lm_head). Default 1. Session 29 (H100,
// docs/performance/decode-boundaries.md): the int4 qkv GEMV's blocks in the step are resident
// 1.3 µs before their wait, stage x 4.1 µs after it and take 6.1 µs more for the second half of
// their one tile; with its rest in L2 that half takes 5.1 µs and tg128 int4 + head gains 0.8% (two
// calls), int8 + head 0.1-0.6%; o / down (2) lost 3-4%. (Prefetching only into L2, nothing into
// registers before the wait, lost everywhere and was removed after that session.)
inline bool v3_l2_rest(bool rope_qkv, bool one_tile) {
  static const int mask = env_int("KILN_QGEMV_L2_REST", 1);
  return (mask & (rope_qkv ? 1 : one_tile ? 2 : 4)) != 0;
}

// KILN_QGEMV_LD_SPAN: the L2 fetch span of the weight loads (mma_frag.cuh's ld_weight_span): 128 bytes
// (default), 256 (every GEMV's .L2::256B before session 42), 64 or 0 (no hint). A warp asks 64 bytes
// of a row at a time; .L2::256B fetched the next 192 with it, and in the step, where L2 is full, part of
// those were read again (most likely evicted before the warp asked for them; with a flushed L2 they were
// not): ncu (no cache flush, layer 0) counts int4 gate/up at 77.6 MB from DRAM for its 66.1 (128: 69.3;
// 64 and 0: 66.1), int8 gate/up 125.1 for 117.5. H100 tg128 (same binary, 3 rounds): int4 + head 387.9
// at 256, 414.7 at 128, 398.8 at 64, 399.4 at 0 tok/s; int8 + head 290.9, 296.9, 277.0, 276.6
// (docs/performance/qgemv-l2-span.md, session 42).
// KILN_QGEMV_LD_SPAN_MULTI: the span of launches whose blocks run several tiles (gate/up, lm_head),
// for a per-launch A/B (default: KILN_QGEMV_LD_SPAN's).
inline int v3_ld_span(bool one_tile) {
  static const int span = env_int_of("KILN_QGEMV_LD_SPAN", 128, {128, 256, 64, 0});
  static const int multi = env_int_of("KILN_QGEMV_LD_SPAN_MULTI", span, {128, 256, 64, 0});
  return one_tile ? span : multi;
}

// Ring depth (registers: <= 128 for 16 warps per SM; ptxas -v). x from L2 (XS = 0) holds 2 more MMA
// chains and its x pieces longer: one slot less.
template <int NT, bool XS>
constexpr int v3_depth() {
  if (NT == 2) return 2;
  return XS ? 4 : 3;
}

}  // namespace kiln::cuda
