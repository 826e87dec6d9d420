// The batch-1 decode attention fused with the o projection (attention_o_fused.h says why).
//
// Grid: one block per (slice of RB o rows, KV head), 4 warps. Before the PDL wait a block requests
// the older K/V of the first two 64-position tiles (cp.async into shared memory: no kernel of this
// step writes them). After the wait: its query heads and the newest K/V row (written by the qkv
// GEMV), then its o weights (RB rows x the KV head's group * 128 columns, int4, with their scales;
// cp.async), which stream while the attention runs as the streaming decode kernel computes it
// (attend_tile over 16 keys a warp, the same 4-warp merge: the same bf16 output); then the product
// of that output with the block's weights on the megakernel's int4 super-chunk product
// (megakernel_dot.cuh), each warp RB / 4 rows over all of the block's columns. A slice's n_kv_heads partial products meet in the workspace; the
// slice's last block (a counter) sums them in KV-head order and adds the sum into y, so the
// result does not depend on which block finishes last.
//
// The attention is computed n_rows / RB times per KV head (32 for Llama-3-8B's o): at <= 256
// positions that is <= 128 KB of K/V a block, mostly from L2, against the 9.4 MB of o weights the
// grid reads once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/attention_decode_walk.cuh"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_o_fused.h"
#include "kernels/cuda/attention_o_trace.h"
#include "kernels/cuda/block_trace.cuh"
#include "kernels/cuda/megakernel/megakernel_dot.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

constexpr int kD = 128, kThreads = 128, kWarps = 4, kQRows = 8, kTile = attn::kTileKv;
constexpr int kSc = 128;  // k of an int4 super-chunk (64 bytes of a row; qmatmul.h's layout)

// Byte offsets of the shared memory, from the group (query heads per KV head) and RB.
struct Smem {
  int kv, q, ms, ls, os, w, sc, x, xsum, total;
};
__host__ __device__ constexpr Smem smem_of(int group, int rows) {
  const int scb = group * kD / kSc;  // super-chunks of the block's columns
  Smem s{};
  int at = 0;
  s.kv = at, at += 2 * 2 * kTile * kD * 2;  // two stages of a K tile and a V tile
  // The 4 warps' merge area, (4, group) maxima and sums and (4, group, kD) outputs (16.6 KB at a
  // group of 8), over the stages once the last tile is done: two blocks of a group of 7 or 8 then
  // fit a SM.
  s.ms = s.kv;
  s.ls = s.ms + 16 * group;
  s.os = s.ls + 16 * group;
  s.q = at, at += kQRows * kD * 2;
  s.w = at, at += rows * scb * 64;
  s.sc = at, at += rows * scb * 8;
  s.x = at, at += group * kD * 2;
  s.xsum = at, at += (scb * 4 + 15) / 16 * 16;
  s.total = at;
  return s;
}

template <int RB>
__global__ void __launch_bounds__(kThreads, 2)
    attention_o_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len,
                       const uint8_t* __restrict__ wq, const float2* __restrict__ scales, float* __restrict__ y,
                       float* __restrict__ partials, uint32_t* __restrict__ counters, int n_kv_heads, int group,
                       int64_t N, int64_t K, float scale_log2, uint64_t* __restrict__ trace) {
  // KILN_ATTN_O_TRACE (attention_o_trace.h): thread 0 of each block stamps its points (no-ops when off).
  using Stamps = BlockStamps<AttnOTrace::kBlocks, AttnOTrace::kWords>;
  Stamps::enter(trace);
  extern __shared__ __align__(16) unsigned char smem[];
  const Smem L = smem_of(group, RB);
  const int kvh = int(blockIdx.x) % n_kv_heads, slice = int(blockIdx.x) / n_kv_heads;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int scb = group * kD / kSc;
  const int64_t r0 = int64_t(slice) * RB;
  auto k_stage = [&](int st) { return reinterpret_cast<bf16*>(smem + L.kv) + st * 2 * kTile * kD; };
  auto v_stage = [&](int st) { return k_stage(st) + kTile * kD; };
  bf16* const q_slot = reinterpret_cast<bf16*>(smem + L.q);
  // Rows of an even number of super-chunks are a multiple of 128 bytes apart: piece p of odd rows
  // sits at p ^ 4, so a quarter warp's 16-byte loads (rows g, g + 1 at the same t) miss each other's banks.
  const int swz = scb % 2 == 0 ? 4 : 0;

  const int len = kv_len[0];  // host-written: readable before the wait
  const int n_tiles = len > 0 ? (len + kTile - 1) / kTile : 0;
  const int newest = len - 1, newest_tile = newest / kTile;
  auto load_tile = [&](int tile, int st, bool skip_newest) {
    const int k0 = tile * kTile, n = min(kTile, len - k0);
    const int skip = skip_newest && tile == newest_tile ? newest - k0 : -1;
    attn::load_tile_async<kD, kTile, kThreads>(
        k_stage(st), n, kD, [&](int r) { return kv.k + kv.offset_as<false>(0, k0 + r, kvh); }, kv.k,
        int(threadIdx.x), skip);
    attn::load_tile_async<kD, kTile, kThreads>(
        v_stage(st), n, kD, [&](int r) { return kv.v + kv.offset_as<false>(0, k0 + r, kvh); }, kv.v,
        int(threadIdx.x), skip);
  };
  // The o weights and their scales into shared memory: cp.async group B (the tiles' group A is
  // older, so the attention waits only for its own loads).
  auto request_weights = [&] {
    const int pieces = scb * 4;  // 16-byte pieces of a row's columns
    const uint8_t* w0 = wq + r0 * (K / 2) + int64_t(kvh) * scb * 64;
    for (int i = int(threadIdx.x); i < RB * pieces; i += kThreads) {
      const int r = i / pieces, p = i - r * pieces;
      attn::cp_async16(smem + L.w + (r * pieces + (p ^ ((r & 1) * swz))) * 16, w0 + r * (K / 2) + p * 16, true);
    }
    const float* s0 = reinterpret_cast<const float*>(scales + r0 * (K / kSc) + int64_t(kvh) * scb);
    for (int i = int(threadIdx.x); i < RB * scb * 2; i += kThreads) {
      const int r = i / (scb * 2), e = i - r * scb * 2;
      attn::cp_async4(reinterpret_cast<float*>(smem + L.sc) + i, s0 + r * (K / kSc) * 2 + e, true);
    }
    attn::cp_async_commit();
  };
  // ---- before the wait: what no kernel of this step writes, the older K/V of the first two tiles
  // (group A). The weights go after the wait (below): requested before it, as the GEMVs request
  // theirs, tg128 was the same (session 29, call 4), and loads after the wait queue behind a
  // flood of weight requests (x's staging in the GEMVs). Requested only once q and the first tile
  // had landed, tg128 was the same too (session 31): the first tile then landed 2 µs sooner and the
  // rest of the attention took that much longer ----
  for (int tile = 0; tile < min(n_tiles, 2); ++tile) load_tile(tile, tile, true);
  attn::cp_async_commit();
  const int64_t newest_off = len > 0 ? kv.offset_as<false>(0, newest, kvh) : 0;

  pdl_wait();
  pdl_launch_dependents();
  Stamps::cycles(trace, AttnOTrace::kAfterWait);

  // ---- the attention of this KV head's query heads ----
  // q and the newest K/V row by plain loads (a cp.async group here would have to wait for the
  // weights' group before it): thread i copies 16 bytes of q slot row i / 16 (zeros past the
  // group), threads 0..31 also the newest K (0..15) or V (16..31) row's chunk i % 16.
  static_assert(kQRows * kD / 8 == kThreads, "one 16-byte piece of the q slot a thread");
  // The weights are requested right after these loads, behind them in the queues, and stream while
  // the attention runs.
  {
    const int r = int(threadIdx.x) / (kD / 8), c = int(threadIdx.x) % (kD / 8);
    const uint4 v = r < group ? ld_after_wait(q + (int64_t(kvh) * group + r) * kD + c * 8) : make_uint4(0, 0, 0, 0);
    const bool newest_here = len > 0 && newest_tile < 2 && threadIdx.x < 2 * (kD / 8);
    const bool is_v = threadIdx.x >= kD / 8;
    const uint4 kv_piece =
        newest_here ? ld_after_wait((is_v ? kv.v : kv.k) + newest_off + c * 8) : make_uint4(0, 0, 0, 0);
    request_weights();
    *reinterpret_cast<uint4*>(q_slot + attn::swz<kD>(r, c)) = v;
    if (newest_here) {
      bf16* const dst = is_v ? v_stage(newest_tile) : k_stage(newest_tile);
      *reinterpret_cast<uint4*>(dst + attn::swz<kD>(newest - newest_tile * kTile, c)) = kv_piece;
    }
  }

  uint32_t qf[kD / 16][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int key0 = warp * 16;
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int st = tile & 1;
    // Groups in commit order: A (tiles 0, 1), the weights' B, then one a reloaded stage (tiles 2, 3).
    if (tile < 2)
      attn::cp_async_wait<1>();  // its group is older than the weights' (or than tile 2's)
    else
      attn::cp_async_wait<0>();
    __syncthreads();  // the tile (and at tile 0 q) is in shared memory for every thread
    if (tile == 0) {
      Stamps::cycles(trace, AttnOTrace::kFirstTile);
      attn::load_q_frags8<kD>(qf, q_slot);
    }
    const int visible_n = min(kTile, len - tile * kTile);
    if (visible_n >= kTile) {
      attn::attend_tile<kD, 16, false>(qf, k_stage(st), v_stage(st), key0, m, l, o, scale_log2,
                                       [](int, int) { return true; });
    } else if (key0 < visible_n) {
      attn::attend_tile<kD, 16, true>(qf, k_stage(st), v_stage(st), key0, m, l, o, scale_log2,
                                      [&](int, int key) { return key < visible_n; });
    }
    if (tile + 2 < n_tiles) {  // over 128 positions: the stage's next tile, after every warp is done with it
      __syncthreads();
      load_tile(tile + 2, st, false);
      attn::cp_async_commit();
    }
  }
  float* const ms = reinterpret_cast<float*>(smem + L.ms);
  float* const ls = reinterpret_cast<float*>(smem + L.ls);
  float* const os = reinterpret_cast<float*>(smem + L.os);
  bf16* const xs = reinterpret_cast<bf16*>(smem + L.x);
  float* const xsum = reinterpret_cast<float*>(smem + L.xsum);
  attn::cp_async_wait<0>();  // (with no tile, the weights)
  __syncthreads();           // every warp is done with the stages, which the merge area reuses
  attn::store_warp_state<kD>(ms, ls, os, group, m, l, o, scale_log2);
  __syncthreads();
  for (int i = int(threadIdx.x); i < group * kD; i += kThreads) {
    const attn::WarpMerge w = attn::merge_warps<kD>(ms, ls, os, group, i / kD, i % kD);
    xs[i] = __float2bfloat16(n_tiles > 0 ? w.num / w.den : 0.0f);  // the separate kernels' bf16 output
  }
  __syncthreads();
  for (int sc = warp; sc < scb; sc += kWarps) {  // sum(x) per super-chunk: the int4 fold's min' term
    float s = 0.0f;
    for (int k = lane; k < kSc; k += 32) s += __bfloat162float(xs[sc * kSc + k]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) xsum[sc] = s;
  }
  __syncthreads();
  Stamps::cycles(trace, AttnOTrace::kMerged);

  // ---- its product with the block's o weights: warp w, rows [w RB / 4, (w + 1) RB / 4), on the
  // decode megakernel's super-chunk product (megakernel_dot.cuh: qgemv v3's int4 MMA forms from
  // shared memory) ----
  constexpr int kRowsPerWarp = RB / kWarps;
  const uint32_t w_base = attn::smem_u32(smem + L.w), x_lane = attn::smem_u32(xs) + 16 * t;
  const float2* const ssc = reinterpret_cast<const float2*>(smem + L.sc);
  auto piece = [&](int row, int sc) {  // lane t's 16-byte piece of super-chunk sc of a row
    return w_base + uint32_t((row * scb * 4 + ((sc * 4 + t) ^ ((row & 1) * swz))) * 16);
  };
#pragma unroll
  for (int rt = 0; rt < kRowsPerWarp / 16; ++rt) {
    const int rlo = warp * kRowsPerWarp + rt * 16 + g, rhi = rlo + 8;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int sc = 0; sc < scb; ++sc)
      mk::superchunk<QuantFormat::int4>(acc, piece(rlo, sc), piece(rhi, sc), x_lane + uint32_t(2 * sc * kSc), xsum[sc],
                                        ssc[rlo * scb + sc], ssc[rhi * scb + sc]);
    if (t == 0) {  // column 0 of the MMA tile: the one activation row
      partials[int64_t(kvh) * N + r0 + rlo] = acc[0];
      partials[int64_t(kvh) * N + r0 + rhi] = acc[2];
    }
  }

  Stamps::cycles(trace, AttnOTrace::kProduct);  // (thread 0's rows: its warp's partials written)

  // ---- the slice's last block adds the KV heads' partials into y, in KV-head order ----
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counters + slice, 1u) == uint32_t(n_kv_heads - 1);
  __syncthreads();
  if (!last) {
    Stamps::exit(trace);
    return;
  }
  __threadfence();
  for (int i = int(threadIdx.x); i < RB; i += kThreads) {
    float s = 0.0f;
    for (int h = 0; h < n_kv_heads; ++h) s += __ldcg(partials + int64_t(h) * N + r0 + i);
    y[r0 + i] += s;
  }
  if (threadIdx.x == 0) counters[slice] = 0u;  // for the next launch (after this grid completes)
  Stamps::exit(trace);
}

// Rows of a slice for this shape, or 0: 128 where two blocks of that size fit a SM, else 64.
// Decided once per (group, rows); sets the kernels' shared-memory limit on the way.
int slice_rows(int group, int64_t rows) {
  static std::mutex mu;
  static std::map<std::pair<int, int64_t>, int> decided;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(group, rows);
  if (auto it = decided.find(key); it != decided.end()) return it->second;
  auto fits = [&](int rb, auto kernel) {
    if (rows % rb != 0) return false;
    const int bytes = smem_of(group, rb).total;
    int per_sm = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, bytes) != cudaSuccess) {
      cudaGetLastError();  // a size past the device's limit: not fusable, not an error
      return false;
    }
    return per_sm >= 2;
  };
  const int rb = fits(128, attention_o_kernel<128>) ? 128 : fits(64, attention_o_kernel<64>) ? 64 : 0;
  decided[key] = rb;
  return rb;
}

}  // namespace

int64_t attention_o_partial_floats(int n_kv_heads, int64_t o_rows) { return int64_t(n_kv_heads) * o_rows; }
int64_t attention_o_counters(int64_t o_rows) { return (o_rows + 63) / 64; }

bool attention_o_fusable(const QWeight& wo, int n_heads, int n_kv_heads, int head_dim, const KvLayout& kv,
                         int64_t max_kv_len) {
  if (wo.format != QuantFormat::int4 || wo.group != kSc || head_dim != kD || n_kv_heads <= 0) return false;
  if (n_heads % n_kv_heads != 0 || n_heads / n_kv_heads > kQRows || wo.cols != int64_t(n_heads) * kD) return false;
  if (!qweight_packable(wo.format, wo.cols, wo.group) || max_kv_len > kAttnOMaxPositions || max_kv_len < 1) return false;
  if (kv.paged() || kv.quant != KvQuant::none || !attn::kv_fast_ok(kv)) return false;
  return slice_rows(n_heads / n_kv_heads, wo.rows) > 0;
}

void attention_o_fused(const bf16* q, const KvLayout& kv, const int32_t* kv_len, const QWeight& wo, float* y,
                       const AttnOWorkspace& ws, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(attention_o_fusable(wo, n_heads, n_kv_heads, head_dim, kv, 1),
                    "attention_o_fused: an o weight or cache the fused kernel does not take");
  const int group = n_heads / n_kv_heads, rb = slice_rows(group, wo.rows);
  const dim3 grid(unsigned(int64_t(n_kv_heads) * (wo.rows / rb)));
  const float scale_log2 = attn::kLog2e / sqrtf(float(head_dim));
  const auto* w = static_cast<const uint8_t*>(wo.data);
  uint64_t* const trace = attention_o_trace_next_slot();
  const auto* s = reinterpret_cast<const float2*>(wo.scales);
  if (rb == 128)
    launch_pdl(attention_o_kernel<128>, grid, dim3(kThreads), size_t(smem_of(group, 128).total), stream, q, kv, kv_len,
               w, s, y, ws.partials, ws.counters, n_kv_heads, group, wo.rows, wo.cols, scale_log2, trace);
  else
    launch_pdl(attention_o_kernel<64>, grid, dim3(kThreads), size_t(smem_of(group, 64).total), stream, q, kv, kv_len,
               w, s, y, ws.partials, ws.counters, n_kv_heads, group, wo.rows, wo.cols, scale_log2, trace);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
