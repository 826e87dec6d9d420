// Flash-decoding: one query token per sequence against its whole cache.
//
// Fast path (decode_mma_kernel<D, kPaged, kStages>, D = 64 or 128 with head dims below D
// zero-padded). Grid (P, KV head x head group, sequence); P is fixed on the host (graph replay: a
// pure function of batch, heads and capacity, so one plan serves every layer and step) and each
// block derives its share of the sequence from kv_len at run time (decode_split): by default split
// s of P takes the 64-position tiles s, s + P, s + 2P, ... (interleaved, so the P blocks of a KV head
// sweep one window of the cache together), or one contiguous chunk (DecodeTuning::interleave = 0);
// blocks with nothing to read exit before touching memory. A block = 4 warps takes the up-to-16
// query heads of its KV group as the 16 rows of an mma tile and streams its tiles through a
// kStages-deep cp.async pipeline (3 by default: two tiles = 64 KB in flight at D = 128 while one is
// computed, every load a 16-byte chunk of a K/V row); warp w scores keys 16w .. 16w+15 of every
// tile with bf16 mma.sync (fp32 accumulate) and keeps its own online softmax; the 4 warps merge
// through shared memory. A sequence whose tiles all fall to one block is normalized and written by
// it; otherwise the unnormalized partial output and (max, sum) go to the workspace and the combine
// kernel (launched with programmatic dependent launch on sm_90, so its launch overlaps the split
// kernel) merges the blocks that held data. The split kernel is PDL-launched too (session 4): its
// blocks issue the loads of their first older K/V tiles before griddepcontrol.wait, so they
// overlap the tail of the kernel that wrote q and this step's K/V (the fused qkv GEMV triggers its
// dependents at its start); q and the tile with the newest position load after the wait.
// Measured (H200, kernel lab, 32/8 heads, d 128): b=1 L=32k 43.5 us (3084 GB/s of K/V; 40.6 us per
// call in a run of 10), b=64 L=2k 132.5 us (4052 GB/s, at the copy ceiling); the tunings the lab
// compares (stages 2/4, 2-4 waves of split blocks, no PDL, contiguous chunks) are all slower.
//
// Paged KV (kv.block_table set, kv_layout.h): the same kernel instantiated with kPaged = true;
// each row of a K/V tile is addressed on its own through the block table (a 64-position tile
// spans several blocks), so only the row pointers change, not the tiling or the arithmetic:
// paged and contiguous layouts holding the same values give bit-identical outputs. The block ids
// of a tile are fetched into registers one tile ahead (PagedTileLoader, attention_mma.h): the
// lookup latency hides behind a tile's compute. Measured (H200, kernel lab, 16-token blocks in
// shuffled order, 32/8 heads, d 128): paged vs contiguous +4% at b=1 L=32k and b=64 L=2k, +9% at
// b=16 L=8k and b=256 L=512 (per-row lookups without the prefetch: +13..35%).
//
// At one split block per (sequence, head group) -- P = 1 -- the host runs the streaming kernel
// instead (attention_decode_stream.cu, session 14: the same tiles and merge as a persistent stream
// over the pairs, bit-identical outputs) when the group has at most 8 query heads and two of its
// blocks fit on a SM; and from 7 pairs per 8 resident warps on, the slice kernel instead of that
// (attention_decode_slices.cu, session 16: a K/V stream per warp in 16-position slices, so partial
// 64-position tiles no longer hold a tile slot each; same math, another fp32 summation order).
//
// Fallback (attention_decode_fp32.cu: the previous CUDA-core kernel, fixed 256-position splits over
// the capacity) when pointers or strides are not 16-byte aligned.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_decode_combine.h"
#include "kernels/cuda/attention_decode_slices.h"
#include "kernels/cuda/attention_decode_stream.h"
#include "kernels/cuda/attention_decode_walk.cuh"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/epilogue.cuh"

namespace kiln::cuda {
namespace {

// ---- tensor-core path ----
constexpr int kMmaThreads = 128, kMmaRows = 16;
constexpr int kMinChunk = attn::kTileKv;

// Positions per split block for length len with P blocks: >= 64, a multiple of 64, P * chunk >= len.
__device__ __forceinline__ int decode_chunk(int len, int P) {
  const int per = (len + P - 1) / P;
  return max(kMinChunk, (per + kMinChunk - 1) / kMinChunk * kMinChunk);
}

// The 64-position tiles split block `split` of P takes from a sequence of len positions: tile i
// starts at pos0 + i * step and holds min(64, end - start) keys; used = blocks with data.
//   contiguous chunks (interleave = 0): block s takes positions [s chunk, (s + 1) chunk);
//   interleaved (interleave = 1): block s takes tiles s, s + P, s + 2P, ..., so the P blocks of a
//   KV head sweep the cache together, one contiguous P x 64-position window at a time.
struct DecodeSplit {
  int n_tiles, pos0, step, end, used;
};
__device__ __forceinline__ DecodeSplit decode_split(int len, int P, int split, int interleave) {
  DecodeSplit r;
  if (interleave) {
    const int T = (len + kMinChunk - 1) / kMinChunk;
    r.n_tiles = split < T ? (T - split + P - 1) / P : 0;
    r.pos0 = split * kMinChunk;
    r.step = P * kMinChunk;
    r.end = len;
    r.used = min(P, T);
  } else {
    const int chunk = decode_chunk(len, P), p0 = split * chunk, n_pos = min(chunk, len - p0);
    r.n_tiles = n_pos > 0 ? (n_pos + kMinChunk - 1) / kMinChunk : 0;
    r.pos0 = p0;
    r.step = kMinChunk;
    r.end = p0 + max(n_pos, 0);
    r.used = (len + chunk - 1) / chunk;
  }
  return r;
}

template <int D, int kStages>
constexpr size_t decode_smem_bytes() {
  return size_t(kMmaRows * D + kStages * 2 * attn::kTileKv * D) * sizeof(bf16);
}

// Programmatic dependent launch (sm_90, pdl.cuh): the split kernel lets the combine kernel launch
// while it runs; the combine waits for the split kernel's writes before reading the workspace.
// Both are no-ops where the launch carried no PDL attribute.

// Two blocks per SM (187 registers at D = 128); the 2-stage variant (68 KB of shared memory) is
// held to 168 registers so three fit.
template <int D, bool kPaged, int kStages>
__global__ void __launch_bounds__(kMmaThreads, kStages == 2 ? 3 : 2)
    decode_mma_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len, DecodeWorkspace ws,
                      bf16* __restrict__ out, int n_heads, int group, int head_groups, int d, int ws_splits,
                      float scale_log2, int interleave, int early_rows) {
  using namespace attn;
  extern __shared__ uint4 smem_raw[];
  bf16* const qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* const stages = qs + kMmaRows * D;
  const int split = blockIdx.x, b = blockIdx.z;
  const int kvh = blockIdx.y / head_groups, hg = blockIdx.y % head_groups;
  const int h0 = kvh * group + hg * kMmaRows;       // first query head of this block
  const int nh = min(kMmaRows, group - hg * kMmaRows);  // query heads in this block
  // Launched with PDL (the split's prologue overlaps the kernel that wrote q and this step's K/V):
  // before pdl_wait only what no kernel of this step writes is touched -- kv_len (host-written) and
  // the K/V tiles of earlier positions; q and the tile holding position len - 1 come after it (with
  // early_rows, all of that tile but position len - 1 itself comes before).
  const int len = kv_len[b];
  const DecodeSplit sp = decode_split(len, int(gridDim.x), split, interleave);
  if (sp.n_tiles <= 0) {  // past the end: nothing to read or write (exiting counts as the trigger)
    // With one split block per sequence no combine follows (launch_decode_combine), so this grid's
    // completion must imply its predecessor's even if no sequence has data (pdl.cuh's contract).
    if (gridDim.x == 1) pdl_wait();
    return;
  }
  const bool single = sp.used <= 1;
  const int n_tiles = sp.n_tiles;
  auto tile_pos = [&](int tile) { return sp.pos0 + tile * sp.step; };
  auto tile_keys = [&](int tile) { return min(kTileKv, sp.end - tile_pos(tile)); };
  auto fresh = [&](int tile) { return tile_pos(tile) + tile_keys(tile) >= len; };  // holds position len - 1
  const int warp = threadIdx.x / 32;

  auto k_stage = [&](int st) { return stages + st * 2 * kTileKv * D; };
  auto v_stage = [&](int st) { return stages + st * 2 * kTileKv * D + kTileKv * D; };
  [[maybe_unused]] PagedTileLoader<D, kTileKv, kMmaThreads> paged;  // kPaged: block ids of the next tile
  // paged: the ids were fetched by prefetch_ids(tile); skip_row: a row left for load_newest_row
  auto load_kv = [&](int tile, int st, int skip_row = -1) {
    const int k0 = tile_pos(tile), n = tile_keys(tile), tid = int(threadIdx.x);
    if constexpr (kPaged) {
      paged.load(k_stage(st), v_stage(st), kv, kvh, k0, n, d, skip_row);
    } else {
      load_tile_async<D, kTileKv, kMmaThreads>(
          k_stage(st), n, d, [&](int r) { return kv.k + kv.offset_as<false>(b, k0 + r, kvh); }, kv.k, tid, skip_row);
      load_tile_async<D, kTileKv, kMmaThreads>(
          v_stage(st), n, d, [&](int r) { return kv.v + kv.offset_as<false>(b, k0 + r, kvh); }, kv.v, tid, skip_row);
    }
  };

  auto prefetch_ids = [&](int tile) {
    if constexpr (kPaged) {
      if (tile < n_tiles)
        paged.fetch(kv.block_table + int64_t(b) * kv.bt_stride, kv.block_shift, tile_pos(tile), tile_keys(tile));
    }
  };

  // The first kStages - 1 tiles, one cp.async group each: the older ones now (early_rows: the
  // fresh one too, but for position len - 1), ...
  const int64_t newest_off =
      early_rows && threadIdx.x < 2 * (D / 8) ? kv.offset_as<kPaged>(b, len - 1, kvh) : 0;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles && (!fresh(st) || early_rows)) {
      prefetch_ids(st);
      load_kv(st, st, fresh(st) ? len - 1 - tile_pos(st) : -1);
    }
    cp_async_commit();
  }
  pdl_wait();
  pdl_launch_dependents();
  // ... then q and a fresh tile among them, as one more group; the prologue waits for all of them.
  const bf16* qb = q + (int64_t(b) * n_heads + h0) * d;
  load_tile_async<D, kMmaRows, kMmaThreads>(qs, nh, d, [&](int r) { return qb + r * d; }, q);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles && fresh(st)) {
      if (early_rows) {
        load_newest_row<D>(kv, newest_off, k_stage(st), v_stage(st), len - 1 - tile_pos(st), d, int(threadIdx.x));
      } else {
        prefetch_ids(st);
        load_kv(st, st);
      }
    }
  }
  cp_async_commit();
  prefetch_ids(kStages - 1);

  cp_async_wait<0>();  // Q and the first kStages - 1 tiles landed
  __syncthreads();
  uint32_t qf[D / 16][4];
  load_q_frags<D>(qf, qs, 0);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile landed for every thread; the stage of tile - 1 is free
    if (tile + kStages - 1 < n_tiles) {
      load_kv(tile + kStages - 1, (tile + kStages - 1) % kStages);
      prefetch_ids(tile + kStages);  // lands while this tile is computed
    }
    cp_async_commit();
    const int st = tile % kStages, key0 = warp * 16;
    const int visible_n = tile_keys(tile);  // keys of this tile that exist
    if (visible_n >= kTileKv) {
      attend_tile<D, 16, false>(qf, k_stage(st), v_stage(st), key0, m, l, o, scale_log2,
                                [](int, int) { return true; });
    } else if (key0 < visible_n) {
      attend_tile<D, 16, true>(qf, k_stage(st), v_stage(st), key0, m, l, o, scale_log2,
                               [&](int, int key) { return key < visible_n; });
    }
  }

  // Merge the 4 warps through shared memory (reusing the stages): m in log2 units.
  cp_async_wait<0>();
  __syncthreads();
  float* const ms = reinterpret_cast<float*>(stages);       // (4, 16)
  float* const ls = ms + 4 * kMmaRows;                       // (4, 16)
  float* const os = ls + 4 * kMmaRows;                       // (4, 16, D)
  static_assert((8 * kMmaRows + 4 * kMmaRows * D) * sizeof(float) <= kStages * 2 * attn::kTileKv * D * sizeof(bf16));
  store_warp_state<D>(ms, ls, os, kMmaRows, m, l, o, scale_log2);
  __syncthreads();
  for (int i = threadIdx.x; i < nh * d; i += kMmaThreads) {
    const int r = i / d, c = i % d;
    const auto [mx, num, den] = merge_warps<D>(ms, ls, os, kMmaRows, r, c);
    const int64_t head_row = int64_t(b) * n_heads + h0 + r;
    if (single) {
      out[head_row * d + c] = __float2bfloat16(num / den);
    } else {
      const int64_t wrow = head_row * ws_splits + split;
      ws.partial_o[wrow * d + c] = num;
      if (c == 0) {
        ws.partial_ml[wrow * 2] = mx;
        ws.partial_ml[wrow * 2 + 1] = den;
      }
    }
  }
}

// Sum (kMax = false) or maximum over the 128 threads of a block; every thread gets the result.
template <bool kMax>
__device__ __forceinline__ float block_reduce128(float v, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < 4; ++w) v = kMax ? fmaxf(v, red[w]) : v + red[w];
  __syncthreads();  // red may be reused
  return v;
}

// Grid (n_heads, batch), 128 threads: merges the chunks that hold data. The chunks' maxima and
// weights are computed one chunk per thread (weights into shared memory, P floats), then thread c
// sums output dim c over the chunks with 8 independent loads in flight: a few round trips to L2,
// where session 2's loop over the chunks in every thread paid one per chunk. (A 512-thread
// version, 4 thread groups each summing every 4th chunk, measured 1-1.5 us slower at b=1. Session
// 6's version with no barriers -- every thread reading all the chunks' (max, sum) pairs and its
// partials 32 chunks per round trip, folded with an online rescale -- was slower in the engine:
// tg128 at 32k context 182.0 vs 183.9 tok/s, at 8k 210.3 vs 214.1.)
__global__ void __launch_bounds__(kAttnMaxHeadDim)
    decode_combine_mma_kernel(DecodeWorkspace ws, const int32_t* __restrict__ kv_len, bf16* __restrict__ out,
                              int n_heads, int d, int ws_splits, int P, int interleave, int early_max) {
  extern __shared__ float wts[];  // P weights
  __shared__ float red[kAttnMaxHeadDim / 32];
  const int h = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  const int len = kv_len[b];
  const int n_used = decode_split(len, P, 0, interleave).used;
  // Wait before any exit: the PDL-launched o GEMV after this kernel waits only for this one, so its
  // completion must imply the split kernel's (pdl.cuh's contract).
  pdl_wait();  // the split kernel's partials are complete and visible
  // The o GEMV's blocks may start streaming weights now -- unless there are many partials to merge:
  // then this kernel's chain of L2 round trips is the step's critical path, and the GEMV's burst of
  // weight loads would slow it (session 6); the GEMV is then launched when this kernel ends.
  if (n_used <= early_max) pdl_launch_dependents();
  if (n_used <= 1) return;  // one block (or none) had data: the split kernel wrote the output
  const int64_t row = (int64_t(b) * n_heads + h) * ws_splits;
  const float2* ml = reinterpret_cast<const float2*>(ws.partial_ml) + row;  // (max, sum) per chunk
  float mx = -INFINITY;
  for (int s = c; s < n_used; s += kAttnMaxHeadDim) mx = fmaxf(mx, ml[s].x);
  mx = block_reduce128<true>(mx, red);
  float den = 0.0f;
  for (int s = c; s < n_used; s += kAttnMaxHeadDim) {
    const float2 v = ml[s];
    const float w = exp2f(v.x - mx);
    wts[s] = w;
    den += w * v.y;
  }
  den = block_reduce128<false>(den, red);  // its barriers also publish wts
  if (c >= d) return;
  const float* po = ws.partial_o + row * d + c;
  float num = 0.0f;
  int s = 0;
  for (; s + 8 <= n_used; s += 8) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = po[int64_t(s + u) * d];
#pragma unroll
    for (int u = 0; u < 8; ++u) num = fmaf(wts[s + u], v[u], num);
  }
  for (; s < n_used; ++s) num = fmaf(wts[s], po[int64_t(s) * d], num);
  out[(int64_t(b) * n_heads + h) * d + c] = __float2bfloat16(num / den);
}

// Defaults chosen on the H200 by the kernel lab's sweep (PERFORMANCE.md, attention decode v3).
struct DecodeDefaults {
  int stages = 3, split_waves = 1;
  bool pdl = true, interleave = true;
};
constexpr DecodeDefaults kDecodeDefaults{};

template <int D, bool kPaged, int kStages>
void launch_decode_mma(const DecodeTuning& tune, const bf16* q, KvLayout kv, const int32_t* kv_len,
                       int64_t max_kv_len, bf16* out, DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads,
                       int head_dim, cudaStream_t stream) {
  static std::once_flag configured;
  static int resident_blocks = 0;  // blocks of this kernel resident on the whole GPU
  static bool pdl_ok = false;      // compute capability >= 9.0
  constexpr auto kernel = decode_mma_kernel<D, kPaged, kStages>;
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(decode_smem_bytes<D, kStages>())));
    int per_sm = 0;
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kMmaThreads,
                                                                  decode_smem_bytes<D, kStages>()));
    resident_blocks = std::max(1, device_sm_count() * std::max(1, per_sm));
    pdl_ok = device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
  });
  const int group = n_heads / n_kv_heads, head_groups = (group + kMmaRows - 1) / kMmaRows;
  const int ws_splits = int(decode_max_splits(max_kv_len));
  // Splits per (head group, sequence): enough blocks for `waves` waves of resident blocks at
  // lengths near the capacity; at shorter lengths the blocks past the last 64-position tile exit.
  const int waves = tune.split_waves > 0 ? tune.split_waves : kDecodeDefaults.split_waves;
  const int P = decode_split_count(resident_blocks, waves, batch * n_kv_heads * head_groups, ws_splits);
  // One split block per pair: the streaming kernel instead, its blocks persistent over the pairs
  // (attention_decode_stream.cu; KILN_ATTN_DECODE_STREAM=0 or tune.stream = 0 keeps this one).
  static const bool stream_env = env_switch_on("KILN_ATTN_DECODE_STREAM");
  static const bool split_pdl_env = env_switch_on("KILN_ATTN_SPLIT_PDL");
  const bool split_pdl = pdl_ok && (tune.split_pdl < 0 ? split_pdl_env : tune.split_pdl != 0);
  static const bool early_env = env_switch_on("KILN_ATTN_EARLY_ROWS");
  DecodeStreamPrologue prologue;
  prologue.early_rows = tune.early_rows < 0 ? early_env : tune.early_rows != 0;
  // (Only with the default 3 stages: the other counts are the split kernel's tunings, for the lab.)
  if (P == 1 && kStages == 3 && (tune.stream < 0 ? stream_env : tune.stream != 0) &&
      decode_stream_applies(n_heads, n_kv_heads, head_dim) &&
      decode_stream_blocks_per_sm(n_heads, n_kv_heads, head_dim, kPaged) >= 2) {
    // The slice kernel from 7 pairs per 8 resident warps on (a warp is its unit of work: with fewer
    // pairs SM slots stay empty that the streaming kernel's blocks, 4 warps a pair, fill), where
    // two of its blocks fit a SM (attention_decode_slices.cu).
    static const bool slices_env = env_switch_on("KILN_ATTN_DECODE_SLICES");
    if (tune.slices != 0 && (tune.slices > 0 || slices_env)) {  // the same head shapes as the streaming kernel
      const DecodeSlicesFit fit = decode_slices_fit(n_heads, n_kv_heads, head_dim, kPaged);
      if (fit.blocks_per_sm >= 2 &&
          (tune.slices > 0 || 8 * batch * n_kv_heads >= kDecodeSlicesPairsPer8Warps * fit.resident_warps))
        return attention_decode_slices(q, kv, kv_len, out, batch, n_heads, n_kv_heads, head_dim, split_pdl, stream);
    }
    return attention_decode_stream(q, kv, kv_len, out, batch, n_heads, n_kv_heads, head_dim, split_pdl, prologue,
                                   stream);
  }
  dim3 grid(unsigned(P), unsigned(n_kv_heads * head_groups), unsigned(batch));
  const int interleave = (tune.interleave < 0 ? kDecodeDefaults.interleave : tune.interleave != 0) ? 1 : 0;
  // The split kernel itself with PDL (its older K/V tiles start loading while the kernel that wrote
  // q finishes); KILN_ATTN_SPLIT_PDL=0 or tune.split_pdl = 0 launches it normally.
  const float scale_log2 = attn::kLog2e / sqrtf(float(head_dim));
  launch_maybe_pdl(split_pdl, kernel, grid, dim3(kMmaThreads), decode_smem_bytes<D, kStages>(), stream, q, kv, kv_len,
                   ws, out, n_heads, group, head_groups, head_dim, ws_splits, scale_log2, interleave,
                   prologue.early_rows ? 1 : 0);
  KILN_CUDA_CHECK_LAUNCH();
  // The combine (none at P = 1), launched while the split kernel runs when PDL is on (its launch
  // latency hides behind the split kernel; it waits on griddepcontrol.wait before reading partials).
  const bool pdl = pdl_ok && (tune.pdl < 0 ? kDecodeDefaults.pdl : tune.pdl != 0);
  launch_decode_combine(ws, kv_len, out, batch, n_heads, head_dim, ws_splits, P, interleave != 0, pdl, stream);
}

template <int D, bool kPaged>
void launch_decode_stages(const DecodeTuning& tune, const bf16* q, KvLayout kv, const int32_t* kv_len,
                          int64_t max_kv_len, bf16* out, DecodeWorkspace ws, int64_t batch, int n_heads,
                          int n_kv_heads, int head_dim, cudaStream_t stream) {
  // KILN_ATTN_DECODE_STAGES=2|4: another default for an engine-level comparison (D = 128 only;
  // 3 is the default; other values are reported and keep it).
  static const int env_stages = env_int_of("KILN_ATTN_DECODE_STAGES", 0, {2, 3, 4});
  const int stages = tune.stages > 0 ? tune.stages : env_stages > 0 ? env_stages : kDecodeDefaults.stages;
  // Instantiations beyond the default only where the kernel lab compares them (D 128).
  if constexpr (D == 128) {
    if (stages == 2)
      return launch_decode_mma<D, kPaged, 2>(tune, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                             head_dim, stream);
    if (stages == 4)
      return launch_decode_mma<D, kPaged, 4>(tune, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                             head_dim, stream);
  }
  launch_decode_mma<D, kPaged, 3>(tune, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim,
                                  stream);
}

}  // namespace

int decode_split_count(int64_t resident_blocks, int waves, int64_t pairs, int ws_splits) {
  return int(std::clamp<int64_t>((int64_t(waves) * resident_blocks + pairs - 1) / pairs, 1,
                                 std::clamp(ws_splits, 1, kMaxCombineSplits)));
}

// Partials up to which the combine releases the o GEMV right after its wait (KILN_COMBINE_EARLY_MAX;
// 0: never, i.e. the GEMV launches when the combine ends).
static int combine_early_max() {
  static const int v = std::max(0, env_int("KILN_COMBINE_EARLY_MAX", 8));
  return v;
}

void launch_decode_combine(DecodeWorkspace ws, const int32_t* kv_len, bf16* out, int64_t batch, int n_heads,
                           int head_dim, int ws_splits, int P, bool interleave, bool pdl, cudaStream_t stream) {
  // One split block per (sequence, head group) -- P = 1: batches of >= ~33 sequences on an H200, or
  // a capacity of <= 256 positions -- and the split kernel has normalized and written every output
  // itself: the combine's blocks would only wait and exit (65,536 of them per layer at 2048
  // sequences; session 7: +1.6% output tok/s without them). KILN_ATTN_SKIP_P1_COMBINE=0 launches it
  // anyway, for comparison. The split kernel's completion implies its predecessor's (its P = 1
  // blocks wait before they exit, with data or not).
  static const bool skip_p1 = env_switch_on("KILN_ATTN_SKIP_P1_COMBINE");
  if (P == 1 && skip_p1) return;
  // The split weights (P floats) in dynamic shared memory.
  launch_maybe_pdl(pdl, decode_combine_mma_kernel, dim3(unsigned(n_heads), unsigned(batch)), dim3(kAttnMaxHeadDim),
                   size_t(P) * sizeof(float), stream, ws, kv_len, out, n_heads, head_dim, ws_splits, P,
                   interleave ? 1 : 0, combine_early_max());
  KILN_CUDA_CHECK_LAUNCH();
}

const char* attention_decode_impl(const bf16* q, KvLayout kv, const bf16* out, int head_dim) {
  const bool fast = attn::aligned16(q) && attn::aligned16(out) && attn::kv_fast_ok(kv) && head_dim % 8 == 0 &&
                    head_dim <= kAttnMaxHeadDim;
  if (!fast) return "fp32-fallback";
  return head_dim <= 64 ? "mma-d64" : "mma-d128";
}

DecodeWorkspace decode_workspace(float* base, int64_t batch, int n_heads, int head_dim, int64_t max_kv_len) {
  int64_t rows = batch * n_heads * decode_max_splits(max_kv_len);
  return DecodeWorkspace{base, base + rows * head_dim};
}

void attention_decode(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                      DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                      cudaStream_t stream) {
  if (kv.quantized())
    return attention_decode_q8(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
  attention_decode_tuned(DecodeTuning{}, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim,
                         stream);
}

void attention_decode_tuned(const DecodeTuning& tune, const bf16* q, KvLayout kv, const int32_t* kv_len,
                            int64_t max_kv_len, bf16* out, DecodeWorkspace ws, int64_t batch, int n_heads,
                            int n_kv_heads, int head_dim, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(head_dim % 8 == 0 && head_dim <= kAttnMaxHeadDim, "attention: head_dim must be a multiple of 8, <= 128");
  KILN_CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  KILN_CUDA_REQUIRE(batch < 65536, "attention: batch too large");
  if (batch == 0) return;
  KILN_CUDA_REQUIRE(max_kv_len < (int64_t(1) << 31), "attention: max_kv_len too large");
  KILN_CUDA_REQUIRE(!kv.paged() || (kv.block_shift >= 0 && kv.block_shift <= 20 && kv.bt_stride > 0),
                    "attention: bad paged KV layout (block_size must be a power of two)");
  if (attention_decode_impl(q, kv, out, head_dim)[0] == 'm') {
    // Instantiations: D in {64, 128} x {contiguous, paged}.
    if (kv.paged()) {
      if (head_dim <= 64)
        launch_decode_stages<64, true>(tune, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim,
                                       stream);
      else
        launch_decode_stages<128, true>(tune, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                        head_dim, stream);
    } else {
      if (head_dim <= 64)
        launch_decode_stages<64, false>(tune, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                        head_dim, stream);
      else
        launch_decode_stages<128, false>(tune, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                         head_dim, stream);
    }
    return;
  }
  attention_decode_fp32(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
}

}  // namespace kiln::cuda
