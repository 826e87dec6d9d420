// Decode GEMV with int8 / int4 weights, v3 (the default; qgemv.cu keeps v1 / v2 and dispatches):
// a continuous weight stream per warp and the activations staged in shared memory.
//
// Why (H200 session 3): v1 reached 52-54% of copy on gate_up while bf16 v2 and fp8 reach 78-93%. v1
// loads a step of U super-chunks (int4: 4 KB per warp), then processes them one after the other,
// each super-chunk first fetching its activations from L2 (an L2 round trip per super-chunk on the
// critical path) and running 16 MMAs (8 of them the all-ones x-sum) in dependent chains; the next
// step's loads wait for all of that. Per warp, bytes per round trip were half of bf16 v2's (8 KB per
// step, activations loaded with the weights) and the round trip was longer.
//
// v3, per warp: a contiguous range of super-chunks of the block's 16 rows; a ring of D super-chunks
// (weights and their scales) in registers: super-chunk i + D is requested before super-chunk i is
// processed, so D super-chunks stay in flight through the compute. Per block, before the loop
// (and after the warps' first D requests): x is copied into shared memory (rows < M, padded so the
// quad loads are conflict-free) and sum(x) per fold unit (a group of 32, else a super-chunk) is
// computed once into shared memory, so the all-ones MMAs and their chains are gone (int4: 8 MMAs
// per super-chunk and lane pair of rows instead of 16). Each fold unit's MMAs start from zero
// accumulators (no clearing) and fold into the fp32 result as scale * sum((off + q) x) + min' * sum(x),
// the numerics of v1 (only the fp32 summation order differs).
// When x does not fit the block's shared-memory budget (M x K large: M > 8 at K = 4096 on the
// Llama shapes), x comes from L2 per super-chunk and sum(x) from the all-ones MMA as in v1 (XS = 0;
// `qgemv_set_version(4)` forces it, for the lab and the tests).
//
// Instruction budget (per warp and super-chunk of 16 rows = 1 KB of weights for int4 and int8, M <= 8):
//   int4: 2 weight LDG.128, 4 LDS.128 (x), 56 SHF/LOP3, 8 MMAs (2 chains of 4), 1 LDS.64 (x sums),
//         ~12 FP (fold), ring moves and address math: ~95 instructions;
//   int8: 2 LDG.128, 2 LDS.128, 16 PRMT, 4 fp16 MMAs, ~14 FP (session 13; the bf16 nibble path it
//         replaced: 56 SHF/LOP3 and 8 MMAs, ~90 -- still the path with x from L2).
// At 4 TB/s an SM consumes ~15 weight bytes per clock, a super-chunk per ~67 clocks; 4 schedulers
// issue ~270 instructions in that time, so the stream needs ~35% of the issue slots: not the limit
// if D super-chunks in flight cover the memory latency (16 warps x D KB per SM; D = 4: 64 KB).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/block_trace.cuh"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemv_fused.h"
#include "kernels/cuda/gemv_epilogues.cuh"
#include "kernels/cuda/gemv_reduce.cuh"
#include "kernels/cuda/mma_frag.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant/qgemv_v3_parts.cuh"
#include "kernels/cuda/quant/qgemv_trace.h"
#include "kernels/cuda/quant/qgemv_v3_grid.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "kernels/cuda/tile_counters.h"
#include "kernels/cuda/tile_draw.cuh"

namespace kiln::cuda {
namespace {

using namespace qk;

constexpr int kV3MaxWarps = 8;

// Whether a launch may draw tiles (qgemv_v3_kernel's deal): with x staged in shared memory (XS), and
// not the qkv GEMV's RoPE epilogue, which holds the most registers (with the draw code its int8
// per-channel form spilled, ptxas, session 28) and whose launches run one tile a block on the Llama
// shapes. With x from L2 (M > 8 at K = 4096) the draw code cost the int4 group-32 kernel a spill and
// the first form of drawing measured M = 16 gate/up slower (session 28).
template <class E>
constexpr bool kIsRopeKv = std::is_same_v<E, RopeKvEpi> || std::is_same_v<E, RopeKvQuantEpi>;
template <class E, bool XS>
constexpr bool kV3Draws = XS && !kIsRopeKv<E>;

// NT n-tiles of 8 activation rows; D super-chunks in flight per warp; XS: x staged in shared memory.
// Blocks of 4 or 8 warps (blockDim.x), K split over them.
// E: which rows a tile multiplies and what happens to its results (StoreRows, or a pairing
// epilogue of gemv_epilogues.cuh).
// deal (KILN_QGEMV_DEAL, tile_counters.h): nullptr, the tiles are dealt evenly in advance (base_tiles
// or base_tiles + 1 a block); else every block runs base_tiles of its own first, then draws tiles
// from the counter until none is left.
template <QuantFormat F, int SM, int NT, int D, bool XS, class E, bool H16>
__global__ void __launch_bounds__(kV3MaxWarps * 32, 2)
    qgemv_v3_kernel(const bf16* __restrict__ x, const uint8_t* __restrict__ wq, const float2* __restrict__ scales,
                    E epi, int m_actual, int64_t N, int64_t K, int64_t group, int shift, int base_tiles,
                    uint32_t* __restrict__ deal, bool l2_rest, int ld_span, uint64_t* __restrict__ trace) {
  using Fm = V3Format<F>;
  constexpr int KS = Fm::KS;
  constexpr bool G32 = SM == kG32;
  constexpr int UNIT = v3_fold_unit(F, SM);  // k per fold (and per x sum)
  // int8 with x staged: fp16 MMAs on whole bytes (byte_pair_f16) instead of bf16 MMAs on nibbles.
  constexpr bool F16 = F == QuantFormat::int8 && XS && H16;
  // KILN_QGEMV_TRACE (qgemv_trace.h): thread 0 of each block stamps its points (no-ops when off).
  using Stamps = BlockStamps<QgemvTrace::kBlocks, QgemvTrace::kWords>;
  Stamps::enter(trace);
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[kV3MaxWarps][16][8 * NT + 1];
  const int W = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n_sc = int(K / KS), groups = int(K / group);
  const int64_t row_bytes = F == QuantFormat::int4 ? K / 2 : K;
  // This block's sequence of 16-row tiles: its own [tile0, tile1), then (deal) the drawn ones. The
  // stream below runs through them without draining (the first requests of tile i + 1 are in flight
  // while tile i is finished).
  const int n_tiles = int((N + 15) / 16);
  // Own tiles dealt evenly over the grid: n_tiles = grid x per + extra, without deal the first
  // `extra` blocks run per + 1 (the host divides: a division here cost the M > 8 kernels register
  // spills); with deal every block runs per and the `extra` are drawn.
  const int blk = int(blockIdx.x), per = base_tiles, extra = n_tiles - per * int(gridDim.x);
  const bool dealt = kV3Draws<E, XS> && deal != nullptr;
  const int tile0 = dealt ? blk * per : blk * per + min(blk, extra);
  const int tile1 = tile0 + per + (!dealt && blk < extra ? 1 : 0);
  // The drawn tiles (tile_draw.cuh): position k >= per of the sequence is drawn by the first warp
  // that looks it up, when it requests tile k - 1's last item. Before the wait the warps request only
  // their own tiles (the host makes per > D / items per warp and tile) and draw nothing: only after
  // the wait is the launch before this one on the stream done with its counter.
  __shared__ TileDraws draws;
  if (dealt) draws.init(int(threadIdx.x));  // read after x's staging (its __syncthreads)
  auto seq_tile = [&](int k) {
    if (k < tile1 - tile0) return tile0 + k;
    if (!dealt) return -1;
    int drawn = 0;
    if (lane == 0) drawn = draws.lookup(deal, k, extra, n_tiles - extra);
    return __shfl_sync(0xffffffffu, drawn, 0);
  };
  // This warp's super-chunks of every tile: [sc0, sc1), contiguous (its own 256-byte L2 fetches).
  const int sc0 = int(int64_t(warp) * n_sc / W), sc1 = int(int64_t(warp + 1) * n_sc / W);
  const int nw = sc1 - sc0;

  // The ring: item i (tile i / nw of the sequence, super-chunk sc0 + i % nw) sits in slot i % D until
  // processed.
  uint4 ring_lo[D], ring_hi[D];
  float2 ring_slo[D], ring_shi[D];
  int rq_seq = 0, rq_tile = nw > 0 ? tile0 : -1, rq_sc = sc0;  // the next item to request (-1: none)
  const uint4 *rq_wlo, *rq_whi;
  const float2 *rq_slo, *rq_shi;
  auto rows_of = [&](int tile) {
    int64_t lo0, hi0;
    epi.rows(tile, lo0, hi0);
    const int64_t r_lo = imin64(lo0 + g, N - 1), r_hi = imin64(hi0 + g, N - 1);
    rq_wlo = reinterpret_cast<const uint4*>(wq + r_lo * row_bytes) + t;
    rq_whi = reinterpret_cast<const uint4*>(wq + r_hi * row_bytes) + t;
    rq_slo = scales + r_lo * groups + (G32 ? t % Fm::NG : 0);
    rq_shi = scales + r_hi * groups + (G32 ? t % Fm::NG : 0);
  };
  rows_of(tile0);
  if constexpr (kEpiPrefetches<E>) {  // AddNormRows: every tile's norm weights and residual into L2
    for (int tile = tile0; tile < tile1; ++tile) {
      int64_t lo0, hi0;
      epi.rows(tile, lo0, hi0);
      epi.prefetch(lo0);
    }
  }
  // kRow with one tile: the rows' scales once (re-loading them per super-chunk cost int8 per channel
  // 8% on gate_up: H200 run 2 of session 4).
  const bool row_once = SM == kRow && tile1 - tile0 == 1 && !dealt;
  const float2 once_lo = row_once ? __ldg(rq_slo) : make_float2(0.0f, 0.0f);
  const float2 once_hi = row_once ? __ldg(rq_shi) : make_float2(0.0f, 0.0f);
  auto request = [&](int d) {  // ld_span: the weight loads' L2 fetch span (v3_ld_span)
    ring_lo[d] = ld_weight_span(rq_wlo + 4 * rq_sc, ld_span);
    ring_hi[d] = ld_weight_span(rq_whi + 4 * rq_sc, ld_span);
    if constexpr (SM == kG32) {
      ring_slo[d] = __ldg(rq_slo + Fm::NG * rq_sc);
      ring_shi[d] = __ldg(rq_shi + Fm::NG * rq_sc);
    } else if constexpr (SM == kShift) {
      ring_slo[d] = __ldg(rq_slo + (rq_sc >> shift));
      ring_shi[d] = __ldg(rq_shi + (rq_sc >> shift));
    } else if (!row_once) {  // kRow over several tiles (one tile: loaded once, below)
      ring_slo[d] = __ldg(rq_slo);
      ring_shi[d] = __ldg(rq_shi);
    }
    if (++rq_sc == sc1) {  // the next tile is looked up with its predecessor's last request
      rq_sc = sc0;
      rq_tile = seq_tile(++rq_seq);
      if (rq_tile >= 0) rows_of(rq_tile);
    }
  };
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (rq_tile >= 0) request(d);
  // l2_rest (KILN_QGEMV_L2_REST, qgemv_v3_grid.h): the rest of this warp's share of its first tile, past
  // the D items above, into L2 too, a prefetch per 128-byte line and row (weights: not the kernel before's).
  if (l2_rest && t == 0 && tile1 > tile0 && sc0 + D < sc1) {
    int64_t lo0, hi0;
    epi.rows(tile0, lo0, hi0);
    const int64_t r_lo = imin64(lo0 + g, N - 1), r_hi = imin64(hi0 + g, N - 1);
    for (int sc = (sc0 + D) & ~1; sc < sc1; sc += 2) {
      prefetch_l2(wq + r_lo * row_bytes + 64 * sc);
      prefetch_l2(wq + r_hi * row_bytes + 64 * sc);
    }
  }
  // Launched with PDL (as gemv_mma.cuh): the first D requests above read only weights; x, which
  // the kernel before this one writes, is read after the wait (with ld_after_wait, not __ldg).
  pdl_wait();
  if (epi_releases_early(epi)) pdl_launch_dependents();
  Stamps::cycles(trace, QgemvTrace::kAfterWait);

  // Block prologue (under the first requests' latency): x sums per fold unit, and x itself (XS).
  // (Folding the RMSNorm in front into this prologue, every block normalizing the fp32 row itself,
  // measured slower than the rmsnorm kernel: session 8, code in commit 1ae6b9f.)
  const int row_chunks = int(K / 8);  // 16-byte pieces of an activation row
  const int total = m_actual * row_chunks;
  const uint32_t xs_base = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t x_base = xs_base + uint32_t(K / UNIT) * 8 * NT * 4;
  if constexpr (XS) {
    constexpr int R = 4;           // pieces per lane in flight
    constexpr int CPU = UNIT / 8;  // lanes per fold unit (4, 8 or 16): aligned within a warp
    float* xsum = reinterpret_cast<float*>(smem);
    for (int b0 = warp * 32; b0 < total; b0 += R * W * 32) {  // warp-uniform
      uint4 v[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int i = b0 + r * W * 32 + lane;
        v[r] = i < total ? ld_after_wait(reinterpret_cast<const uint4*>(x) + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int i = b0 + r * W * 32 + lane;
        float f[8];
        unpack8(v[r], f);
        if constexpr (F16) v[r] = f16_over16_piece(f);  // fp16(x / 16); its sums from the rounded values
        float s = ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
#pragma unroll
        for (int o = 1; o < CPU; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (i < total) {
          const int m = i / row_chunks, c = i - m * row_chunks;
          *reinterpret_cast<uint4*>(smem + (x_base - xs_base) + int64_t(m) * v3_row_stride(K) + 16 * c) = v[r];
          if (lane % CPU == 0) xsum[(c / CPU) * 8 * NT + m] = s;
        }
      }
    }
    __syncthreads();
  }

  Stamps::cycles(trace, QgemvTrace::kStaged);

  // Activation row 8n + g of lane (g, t); lanes past M read row 0 instead of zeros (no predicates):
  // they feed only output columns >= M, which are never stored.
  const bf16* xr[NT];
  uint32_t xrow[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int m = 8 * n + g < m_actual ? 8 * n + g : 0;
    xr[n] = x + int64_t(m) * K + 8 * t;
    xrow[n] = x_base + uint32_t(m * v3_row_stride(K)) + 16 * t;
  }
  const uint32_t xs_lane = xs_base + 4 * (2 * t);
  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;

  // One super-chunk: a_lo / a_hi (rows g / g + 8), its scales, k0 = KS sc.
  auto process = [&](const uint4& a_lo, const uint4& a_hi, float2 sl, float2 sh, int sc) {
    const int k0 = sc * KS;
    uint4 b[NT][Fm::XL];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < Fm::XL; ++i) {
        if constexpr (XS)
          b[n][i] = lds128(xrow[n] + uint32_t(2 * k0 + 64 * i));
        else
          b[n][i] = ld_after_wait(reinterpret_cast<const uint4*>(xr[n] + k0 + 32 * i));
      }
    float2 xsv[NT][G32 ? Fm::NG : 1];  // x sums of the fold units, activation rows 8n + 2t, + 1
    if constexpr (XS) {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int u = 0; u < (G32 ? Fm::NG : 1); ++u)
          xsv[n][u] = lds64f(xs_lane + uint32_t(((sc * (KS / UNIT) + u) * 8 * NT + 8 * n) * 4));
    }
    float q[2][NT][4], xs[2][NT][4];  // two MMA chains of sum((off + q) x), (XS = 0) two of sum(x)
    auto fold = [&](int u) {  // fold unit u of the super-chunk
      float2 fl = G32 ? quad_shfl(sl, u) : sl, fh = G32 ? quad_shfl(sh, u) : sh;
      if constexpr (F16) {  // min' expects the nibble path's offset 2176 + byte; F16's is 1024 + byte
        fl.y = fmaf(1152.0f, fl.x, fl.y);
        fh.y = fmaf(1152.0f, fh.x, fh.y);
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        if constexpr (XS) {
          float qs[4];  // the unit's sum((off + q) x): F16 has one MMA chain, the nibble paths two
#pragma unroll
          for (int e = 0; e < 4; ++e) qs[e] = F16 ? q[0][n][e] : q[0][n][e] + q[1][n][e];
          fold4(acc[n], qs, fl, fh, xsv[n][G32 ? u : 0]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 sc2 = e < 2 ? fl : fh;
            acc[n][e] = fmaf(sc2.x, q[0][n][e] + q[1][n][e], fmaf(sc2.y, xs[0][n][e] + xs[1][n][e], acc[n][e]));
          }
        }
      }
    };
    if constexpr (F == QuantFormat::int4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // word j: 32-wide group j of the super-chunk
        const uint32_t wl = word(a_lo, j), wh = word(a_hi, j);
        const uint32_t l0 = pair<0, 0x43004300u>(wl), l1 = pair<4, 0x43004300u>(wl), l2 = pair<8, 0x43004300u>(wl),
                       l3 = pair<12, 0x43004300u>(wl);
        const uint32_t h0 = pair<0, 0x43004300u>(wh), h1 = pair<4, 0x43004300u>(wh), h2 = pair<8, 0x43004300u>(wh),
                       h3 = pair<12, 0x43004300u>(wh);
        const bool first = G32 || j == 0;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint4& xv = b[n][j];
          if (first) {
            mma_acc<true>(q[0][n], l0, h0, l1, h1, xv.x, xv.y);
            mma_acc<true>(q[1][n], l2, h2, l3, h3, xv.z, xv.w);
            if constexpr (!XS) {
              mma_acc<true>(xs[0][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, xv.x, xv.y);
              mma_acc<true>(xs[1][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, xv.z, xv.w);
            }
          } else {
            mma_acc<false>(q[0][n], l0, h0, l1, h1, xv.x, xv.y);
            mma_acc<false>(q[1][n], l2, h2, l3, h3, xv.z, xv.w);
            if constexpr (!XS) {
              mma_acc<false>(xs[0][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, xv.x, xv.y);
              mma_acc<false>(xs[1][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, xv.z, xv.w);
            }
          }
        }
        if (G32) fold(j);
      }
      if (!G32) fold(0);
    } else if constexpr (F16) {
      // q = sum((1024 + byte) x / 16): one fp16 MMA per word pair (the fold shifts min', above).
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // word pairs (2h, 2h + 1): 32-wide group h
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const uint32_t wl = word(a_lo, 2 * h + jj), wh = word(a_hi, 2 * h + jj);
          // Bytes 0 / 2 are k pair (2t, 2t + 1) of the MMA, bytes 1 / 3 pair (2t + 8, 2t + 9), as the
          // bf16 path's nibble pairs at shifts 0 / 8 take them.
          const uint32_t p02 = byte_pair_f16<0x4240u>(wl), p13 = byte_pair_f16<0x4341u>(wl);
          const uint32_t p02h = byte_pair_f16<0x4240u>(wh), p13h = byte_pair_f16<0x4341u>(wh);
          const bool first = jj == 0 && (G32 || h == 0);
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            const uint32_t b0 = jj == 0 ? b[n][h].x : b[n][h].z, b1 = jj == 0 ? b[n][h].y : b[n][h].w;
            if (first)
              mma_acc<true, true>(q[0][n], p02, p02h, p13, p13h, b0, b1);
            else
              mma_acc<false, true>(q[0][n], p02, p02h, p13, p13h, b0, b1);
          }
        }
        if (G32) fold(h);
      }
      if (!G32) fold(0);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // word pairs (2h, 2h + 1): 32-wide group h
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const uint32_t wl = word(a_lo, 2 * h + jj), wh = word(a_hi, 2 * h + jj);
          const uint32_t lo02 = pair<0, 0x43004300u>(wl), hi02 = pair<4, 0x45004500u>(wl),
                         lo13 = pair<8, 0x43004300u>(wl), hi13 = pair<12, 0x45004500u>(wl);
          const uint32_t lo02h = pair<0, 0x43004300u>(wh), hi02h = pair<4, 0x45004500u>(wh),
                         lo13h = pair<8, 0x43004300u>(wh), hi13h = pair<12, 0x45004500u>(wh);
          const bool first = jj == 0 && (G32 || h == 0);
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            const uint32_t b0 = jj == 0 ? b[n][h].x : b[n][h].z, b1 = jj == 0 ? b[n][h].y : b[n][h].w;
            if (first) {
              mma_acc<true>(q[0][n], lo02, lo02h, lo13, lo13h, b0, b1);
              mma_acc<true>(q[1][n], hi02, hi02h, hi13, hi13h, b0, b1);
              if constexpr (!XS) mma_acc<true>(xs[0][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, b0, b1);
            } else {
              mma_acc<false>(q[0][n], lo02, lo02h, lo13, lo13h, b0, b1);
              mma_acc<false>(q[1][n], hi02, hi02h, hi13, hi13h, b0, b1);
              if constexpr (!XS) {
                if (jj == 0)
                  mma_acc<false>(xs[0][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, b0, b1);
                else if (G32 || h == 0)
                  mma_acc<true>(xs[1][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, b0, b1);
                else
                  mma_acc<false>(xs[1][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, b0, b1);
              }
            }
          }
        }
        if (G32) fold(h);
      }
      if (!G32) fold(0);
    }
  };

  // A tile's partials meet in shared memory (as gemv_stash, W at run time) and the epilogue takes
  // them; every warp calls this once per tile, in order (warps with no super-chunks too).
  auto finish_tile = [&](int tile) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        red[warp][g + 8 * (e >> 1)][8 * j + 2 * t + (e & 1)] = F16 ? acc[j][e] * (1.0f / kF16XScale) : acc[j][e];
        acc[j][e] = 0.0f;
      }
    int64_t lo0, hi0;
    epi.rows(tile, lo0, hi0);
    epi.template finish<kV3MaxWarps, NT>(red, W, lo0, hi0, m_actual, N);  // starts with __syncthreads
    __syncthreads();
  };

  // The stream: process item i from its slot, then request item i + D into the same slot (after the
  // processing: the slot's registers are free again, no copies).
  // Items are requested in order, so the next one to request (item i + D) goes to slot d.
  int pr_seq = 0, pr_tile = tile0, pr_sc = sc0;
  if (nw > 0) {
    while (pr_tile >= 0) {  // warp-uniform
#pragma unroll
      for (int d = 0; d < D; ++d) {
        if (pr_tile < 0) break;
        process(ring_lo[d], ring_hi[d], row_once ? once_lo : ring_slo[d], row_once ? once_hi : ring_shi[d], pr_sc);
        if (rq_tile >= 0) request(d);
        if (++pr_sc == sc1) {
          pr_sc = sc0;
          finish_tile(pr_tile);
          pr_tile = seq_tile(++pr_seq);
        }
      }
    }
  } else {
    for (; pr_tile >= 0; pr_tile = seq_tile(++pr_seq)) finish_tile(pr_tile);
  }
  Stamps::value(trace, QgemvTrace::kTiles, uint64_t(pr_seq));
  Stamps::exit(trace);
}

template <QuantFormat F, int SM, int NT, bool XS, class E>
void launch_v3(const bf16* x, const QWeight& w, const E& epi, int m, int warps, int64_t smem, int shift,
               int64_t blocks, cudaStream_t stream) {
  constexpr int D = v3_depth<NT, XS>();
  // KILN_QGEMV_INT8_F16=0: int8 on the bf16 nibble path with x staged too (session 13's A/B).
  static const bool h16 = env_switch_on("KILN_QGEMV_INT8_F16");
  auto kernel = qgemv_v3_kernel<F, SM, NT, D, XS, E, true>;
  if constexpr (F == QuantFormat::int8 && XS)  // the only kernels the switch changes
    if (!h16) kernel = qgemv_v3_kernel<F, SM, NT, D, XS, E, false>;
  static bool configured[2] = {false, false};  // raise the dynamic shared-memory limit once per instantiation
  if (XS && !configured[h16]) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBudget8)));
    configured[h16] = true;
  }
  const int64_t tiles = (w.rows + 15) / 16;
  int per = int(tiles / blocks);
  uint32_t* deal = nullptr;
  const int own = v3_own_tiles(w.cols / (F == QuantFormat::int4 ? V3Format<QuantFormat::int4>::KS
                                                                 : V3Format<QuantFormat::int8>::KS),
                               warps, D, per, tiles % blocks != 0);
  if (kV3Draws<E, XS> && own > 0 && (deal = tile_counter_next(stream)) != nullptr) per = own;
  const bool l2_rest = v3_l2_rest(kIsRopeKv<E>, tiles <= blocks);
  launch_maybe_pdl(gemv_pdl_enabled(), kernel, dim3(unsigned(blocks)), dim3(warps * 32), size_t(XS ? smem : 0), stream,
                   x, static_cast<const uint8_t*>(w.data), reinterpret_cast<const float2*>(w.scales), epi, m, w.rows,
                   w.cols, w.group, shift, per, deal, l2_rest, v3_ld_span(tiles <= blocks),
                   qgemv_trace_next_slot(w.rows, w.cols));
}

// The fused forms (pairing epilogues) run only at M = 1 with x staged in shared memory.
template <class E>
constexpr bool kPlainEpilogue = std::is_same_v<E, StoreRows>;

// Shared memory of a block staging x: x sums per fold unit and the M activation rows.
int64_t v3_smem_bytes(int64_t K, int m, int nt, int unit) {
  return (K / unit) * 8 * nt * 4 + int64_t(m) * v3_row_stride(K);
}

template <QuantFormat F, int SM, int NT, class E>
void dispatch_v3(const bf16* x, const QWeight& w, const E& epi, int m, bool allow_xs, bool persist, int shift,
                 cudaStream_t stream) {
  const int64_t tiles = (w.rows + 15) / 16;
  const bool w8 = v3_wide_blocks(F, m) || tiles <= 2 * int64_t(device_sm_count());  // as gemv v2 for small grids
  const int64_t smem = v3_smem_bytes(w.cols, m, NT, v3_fold_unit(F, SM));
  const bool xs = allow_xs && smem <= (w8 ? kSmemBudget8 : kSmemBudget4);
  // Blocks: at most one wave (4-warp blocks: 4 per SM; 8-warp: 2), so each block stages x once and
  // its stream runs through several tiles; persist = false: one tile per block.
  const int64_t slots = int64_t(device_sm_count()) * (w8 ? 2 : 4);
  int64_t blocks = tiles;
  // One group per row (int8 per channel) runs several tiles a block too, its scales then carried
  // with every super-chunk: with the tiles dealt evenly this beat one tile a block (session 8 run
  // 5: int8 gate_up 37.6 vs 41.0 us, tg128 +4.3%; session 4's uneven grid measured it 8% slower).
  // KILN_QGEMV_ROW_TILES=0: one tile a block, the scales loaded once, for comparison.
  static const bool row_tiles = env_switch_on("KILN_QGEMV_ROW_TILES");
  if (persist && (SM != kRow || row_tiles)) {
    // Fill every slot, the tiles dealt evenly (3 or 4 each for int4 gate_up: 1792 tiles over 528
    // blocks, 13-14 a SM). KILN_QGEMV_FILL_SLOTS=0: the block count of sessions 4-7, as many as
    // runs of ceil(tiles / slots) tiles need (448 blocks of 4 for gate_up: 52 SMs then run 16
    // tiles and 80 SMs 12), for comparison.
    static const bool fill = env_switch_on("KILN_QGEMV_FILL_SLOTS");
    const int64_t per = (tiles + slots - 1) / slots;
    blocks = fill ? std::min(tiles, slots) : (tiles + per - 1) / per;
  }
  if (xs) {
    launch_v3<F, SM, NT, true>(x, w, epi, m, w8 ? 8 : 4, smem, shift, blocks, stream);
  } else if constexpr (kPlainEpilogue<E>) {
    launch_v3<F, SM, NT, false>(x, w, epi, m, w8 ? 8 : 4, smem, shift, blocks, stream);
  } else {
    KILN_CUDA_REQUIRE(false, "fused qgemv: x does not fit shared memory (qgemv_fusable says so)");
  }
}

template <QuantFormat F, int SM, class E>
void by_rows(const bf16* x, const QWeight& w, const E& epi, int m, bool allow_xs, bool persist, int shift,
             cudaStream_t stream) {
  if (m <= 8)
    dispatch_v3<F, SM, 1>(x, w, epi, m, allow_xs, persist, shift, stream);
  else if constexpr (kPlainEpilogue<E>)
    dispatch_v3<F, SM, 2>(x, w, epi, m, allow_xs, persist, shift, stream);
  else
    KILN_CUDA_REQUIRE(false, "fused qgemv: M = 1 only");
}

// The scale layout of w (kG32 / kRow / kShift with its shift), or false for groups that are neither
// 32, K, nor a power-of-two number of super-chunks.
template <QuantFormat F>
bool scale_mode(const QWeight& w, int& mode, int& shift) {
  shift = 0;
  if (w.group == 32) return mode = kG32, true;
  if (w.group == w.cols) return mode = kRow, true;
  const int64_t per = w.group / V3Format<F>::KS;  // super-chunks per group (qweight_packable: whole)
  if (per <= 0 || (per & (per - 1)) != 0) return false;
  while ((int64_t(1) << shift) < per) ++shift;
  mode = kShift;
  return true;
}

template <QuantFormat F, class E>
bool by_scales(const bf16* x, const QWeight& w, const E& epi, int m, bool allow_xs, bool persist, cudaStream_t stream) {
  int mode = 0, shift = 0;
  if (!scale_mode<F>(w, mode, shift)) return false;
  if (mode == kG32)
    by_rows<F, kG32>(x, w, epi, m, allow_xs, persist, 0, stream);
  else if (mode == kRow)
    by_rows<F, kRow>(x, w, epi, m, allow_xs, persist, 0, stream);
  else
    by_rows<F, kShift>(x, w, epi, m, allow_xs, persist, shift, stream);
  return true;
}

template <class E>
bool by_format(const bf16* x, const QWeight& w, const E& epi, int m, bool allow_xs, bool persist, cudaStream_t stream) {
  if (w.format == QuantFormat::int4) return by_scales<QuantFormat::int4>(x, w, epi, m, allow_xs, persist, stream);
  return by_scales<QuantFormat::int8>(x, w, epi, m, allow_xs, persist, stream);
}

}  // namespace

// Called by qgemv (qgemv.cu) after its checks; false (nothing launched) for groups that are neither
// 32, K, nor a power-of-two number of super-chunks (qgemv runs v1 then). allow_xs = false: x from L2
// and the all-ones x sums (version 4: the lab's evidence of what the staging buys).
bool qgemv_v3(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int m, bool allow_xs,
              bool persist, cudaStream_t stream) {
  return by_format(x, w, StoreRows{bias, y, mode}, m, allow_xs, persist, stream);
}

bool qgemv_fusable(const QWeight& w) {
  if (w.format != QuantFormat::int8 && w.format != QuantFormat::int4) return false;
  if (!qweight_packable(w.format, w.cols, w.group) || w.rows % 16 != 0) return false;
  int mode = 0, shift = 0;
  const bool int4 = w.format == QuantFormat::int4;
  if (!(int4 ? scale_mode<QuantFormat::int4>(w, mode, shift) : scale_mode<QuantFormat::int8>(w, mode, shift)))
    return false;
  // x staged at M = 1 within a 4-warp block's budget (dispatch_v3 may pick 8-warp blocks: larger).
  const int unit = v3_fold_unit(w.format, mode);
  return v3_smem_bytes(w.cols, 1, 1, unit) <= kSmemBudget4;
}

void qgemv_rope_kv(const bf16* x, const QWeight& w, const bf16* bias, const RopeKvTarget& out, cudaStream_t stream,
                   const NormApply& norm) {
  KILN_CUDA_REQUIRE(qgemv_fusable(w), "qgemv_rope_kv: unsupported weight");
  KILN_CUDA_REQUIRE(w.rows == require_rope_kv_target(out, w.cols), "qgemv_rope_kv: rows");
  require_norm_apply(norm, w.cols);
  const bool ran = out.kv.quantized() ? by_format(x, w, RopeKvQuantEpi{bias, out, norm}, 1, true, true, stream)
                                      : by_format(x, w, RopeKvEpi{bias, out, norm}, 1, true, true, stream);
  KILN_CUDA_REQUIRE(ran, "qgemv_rope_kv: group layout");
  KILN_CUDA_CHECK_LAUNCH();
}

void qgemv_swiglu(const bf16* x, const QWeight& w, bf16* h, int64_t inter, cudaStream_t stream,
                  const NormApply& norm) {
  KILN_CUDA_REQUIRE(qgemv_fusable(w) && w.rows == 2 * inter && inter % 8 == 0, "qgemv_swiglu: unsupported weight");
  require_norm_apply(norm, w.cols);
  KILN_CUDA_REQUIRE(by_format(x, w, SwiGluEpi{h, inter, norm}, 1, true, true, stream), "qgemv_swiglu: group layout");
  KILN_CUDA_CHECK_LAUNCH();
}

void qgemv_add_norm(const bf16* x, const QWeight& w, float* y, const NormProduce& norm, cudaStream_t stream,
                    NextLaunch next) {
  KILN_CUDA_REQUIRE(qgemv_fusable(w), "qgemv_add_norm: unsupported weight");
  require_norm_produce(norm, w.rows);
  const AddNormRows epi{y, norm, next == NextLaunch::after_wait};
  KILN_CUDA_REQUIRE(by_format(x, w, epi, 1, true, true, stream), "qgemv_add_norm: group layout");
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
