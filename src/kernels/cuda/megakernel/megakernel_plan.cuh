// The decode megakernel's plan, shared by its producer and consumer roles and the host: the block's
// shape, the phases and their counters, the trace's layout, the kernel parameters, and which rows
// of which matrix each block streams in which order (both roles walk the same sequence).
#pragma once

#include <cstdint>

#include "kernels/cuda/gemv_epilogues.cuh"
#include "kernels/cuda/megakernel/decode_megakernel.h"
#include "kernels/cuda/megakernel/megakernel_dot.cuh"

namespace kiln::cuda::mk {

constexpr int kConsumerWarps = kSlotSuperChunks / kWarpSuperChunks;  // 8: warp w takes super-chunks 4w .. 4w + 3
constexpr int kConsumers = 32 * kConsumerWarps;
// Producer warps: one warp's cp.async kept ~2 TB/s in flight for the whole GPU (session 19 run 3), so
// four share the ring, warp p copying the items i with i % 4 == p. 12 warps a block leave 168
// registers a thread (3 warps on each of the SM's 4 register files).
constexpr int kProducerWarps = 4;
constexpr int kThreads = kConsumers + 32 * kProducerWarps;
constexpr int kMaxSlots = 32;

enum Matrix : int { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3 };
enum Phase : int { kPhQkv = 0, kPhAttn = 1, kPhO = 2, kPhGateUp = 3, kPhDown = 4 };

// The step's counters (MegakernelStep::sync): [0] layer 0's norm product, then five phases a layer,
// then the attention's finished splits per (layer, KV head).
__host__ __device__ constexpr int phase_index(int l, int ph) { return 1 + 5 * l + ph; }
__host__ __device__ constexpr int head_done_index(int n_layers, int l, int n_kv_heads) {
  return 1 + 5 * n_layers + l * n_kv_heads;
}

// The trace (MegakernelStep::trace): per block, 2 words for the prologue (ready, done), then per
// layer and phase kPhaseWords (below), then per layer the producer's stall (cycles), then
// the SM clock at the start and the end with the end's time (the cycles' rate); blocks in order.
// Times are %globaltimer ns, read only at phase boundaries; the waits inside a phase are counted in
// SM cycles (clock64): the first trace read %globaltimer around every ring wait and cost the step
// ~7%, clock64 ~3% (session 19 runs 5-6).
constexpr int kPhases = 5;
// Per phase: ready, done, then thread 0's cycles in: the ring wait, the products, the slot release,
// the tile barrier, the epilogue.
constexpr int kPhaseWords = 7;
__host__ __device__ constexpr int64_t trace_block_words(int n_layers) {
  return 2 + int64_t(n_layers) * (kPhaseWords * kPhases + 1) + 3;
}
__host__ __device__ constexpr int64_t trace_clock_offset(int n_layers) {
  return 2 + int64_t(n_layers) * (kPhaseWords * kPhases + 1);
}
__host__ __device__ constexpr int64_t trace_producer_offset(int n_layers, int64_t block) {
  return block * trace_block_words(n_layers) + 2 + int64_t(n_layers) * kPhaseWords * kPhases;
}

// The kernel's parameters (by value, __grid_constant__).
struct Params {
  MegakernelModel m;
  MegakernelStep st;
  int slots;         // ring slots
  uint32_t x_bytes;  // the x staging area (also the attention's scratch)
  bool tma;          // the producer copies with the TMA unit (KILN_MEGAKERNEL_TMA=1) instead of cp.async
  // KILN_MEGAKERNEL_PROBE (wrong results, timing only): 1 the consumers skip the tile products (the
  // ring and the phases alone), 2 the producer copies nothing (the consumers' products alone).
  int probe;
};

struct Dims {
  int64_t rows, cols;
};
__device__ __forceinline__ Dims dims_of(const MegakernelModel& m, int mi) {
  const int64_t q_dim = int64_t(m.n_heads) * m.head_dim, kv_dim = int64_t(m.n_kv_heads) * m.head_dim;
  if (mi == kQkv) return {q_dim + 2 * kv_dim, m.hidden};
  if (mi == kO) return {m.hidden, q_dim};
  if (mi == kGateUp) return {2 * m.inter, m.hidden};
  return {m.hidden, m.inter};
}

// This block's 16-row tiles of matrix mi in layer l: [t0, t0 + n). Dealt evenly; which blocks take
// the extra ones rotates with (layer, matrix), so no block is the slow one in every phase.
struct TileRange {
  int t0, n;
};
__device__ __forceinline__ TileRange tiles_of(int64_t tiles, int l, int mi) {
  const int G = int(gridDim.x);
  const int rank = int((blockIdx.x + uint32_t(l * 4 + mi) * 37u) % uint32_t(G));
  const int base = int(tiles / G), extra = int(tiles % G);
  return {rank * base + min(rank, extra), base + (rank < extra ? 1 : 0)};
}

// The model's RoPE shape as the fused qkv epilogue takes it (no destinations set).
__device__ __forceinline__ RopeKvTarget rope_shape_of(const MegakernelModel& m) {
  RopeKvTarget o;
  o.head_dim = m.head_dim;
  o.rot_dim = m.rot_dim;
  o.interleaved = m.interleaved;
  o.n_heads = m.n_heads;
  o.n_kv_heads = m.n_kv_heads;
  return o;
}

// The two 8-row runs of tile t (slot rows 0..7 = lo0 + 0..7, 8..15 = hi0 + 0..7), paired as the
// fused decode GEMVs pair them: RoPE's partners for q/k, gate row i with up row i, else consecutive.
__device__ __forceinline__ void runs_of(const MegakernelModel& m, int mi, int64_t t, int64_t& lo0, int64_t& hi0) {
  if (mi == kQkv) {
    RopeKvEpi{nullptr, rope_shape_of(m)}.rows(t, lo0, hi0);
  } else if (mi == kGateUp) {
    SwiGluEpi{nullptr, m.inter}.rows(t, lo0, hi0);
  } else {
    lo0 = 16 * t;
    hi0 = lo0 + 8;
  }
}

// Row r (0..15) of the tile whose runs start at lo0 and hi0: the matrix row slot row r holds.
__device__ __forceinline__ int64_t tile_row(int64_t lo0, int64_t hi0, int r) { return r < 8 ? lo0 + r : hi0 + r - 8; }

template <QuantFormat F>
__device__ __forceinline__ int64_t row_bytes_of(int64_t cols) {
  return cols * kBytesPer2K<F> / 2;
}

}  // namespace kiln::cuda::mk
