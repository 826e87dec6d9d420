// The tensor-core GEMV of gemv.cu (its v2; the design and measurements are at the top of gemv.cu),
// with its end left open so the decode step can fold pointwise kernels into it (gemv_fused.cu):
// the policy E says which 16 weight rows block b multiplies, as two runs of 8 (lo0 + 0..7 and
// hi0 + 0..7: consecutive rows for the plain GEMV; a RoPE pair or a gate/up pair for the fused
// ones, so both values of a pair land in one warp) and what happens to the 16 x M results. The main
// loop (weight loads straight into mma.sync fragments, U chunk groups per step) is the same for
// every instantiation.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "core/env.h"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemv_epilogues.cuh"
#include "kernels/cuda/gemv_reduce.cuh"
#include "kernels/cuda/mma_frag.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {

// One step's weight fragments of lane (g, t): chunk groups u = 0..U-1 at chunks base + 4u of rows
// lo0 + g and hi0 + g, zeros past the end of K (the loads that are all the kernel waits on).
template <int U>
struct WeightStage {
  uint4 lo[U], hi[U];
  __device__ __forceinline__ void load(const uint4* w_lo, const uint4* w_hi, int64_t base, int64_t n_chunks) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + 4 * u;
      if (c < n_chunks) {
        lo[u] = qk::ld_weight(w_lo + c);
        hi[u] = qk::ld_weight(w_hi + c);
      } else {
        lo[u] = hi[u] = make_uint4(0, 0, 0, 0);
      }
    }
  }
};

// x's fragments for one step (one 16-byte load per n-tile and chunk group, predicated: no load for
// activation rows >= M or chunks past K) and the 2 MMAs per chunk group and n-tile.
// XPRED: x through ld_after_wait_if (a predicated load), else through a branch around
// ld_after_wait; launch_gemv_mma picks per grid shape, as measured (gemv.cu's header, v2).
template <int NT, int U, bool XPRED = true>
__device__ __forceinline__ void gemv_mma_step(float (&acc)[NT][4], const WeightStage<U>& a, const uint4* const (&xr)[NT],
                                              const bool (&x_ok)[NT], int64_t base, int64_t n_chunks) {
  uint4 b[NT][U];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + 4 * u;
      if constexpr (XPRED)
        b[j][u] = ld_after_wait_if(xr[j] + c, x_ok[j] && c < n_chunks);
      else
        b[j][u] = (x_ok[j] && c < n_chunks) ? ld_after_wait(xr[j] + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      qk::mma_bf16(acc[j], a.lo[u].x, a.hi[u].x, a.lo[u].y, a.hi[u].y, b[j][u].x, b[j][u].y);
      qk::mma_bf16(acc[j], a.lo[u].z, a.hi[u].z, a.lo[u].w, a.hi[u].w, b[j][u].z, b[j][u].w);
    }
}

// NT n-tiles of 8 activation rows (1: M <= 8, 2: M <= 16); U chunk groups per step; W warps split
// K. Needs K % 8 == 0. x: M bf16 rows of K (L1/L2 resident: every block reads all of x).
// PIPE false (gemv.cu's v2): a warp loads a step's 2U weight chunks, then multiplies them, then
// loads the next step: between its bursts it has no weight load in flight. PIPE true (v4): two
// register stages of U chunk groups; the loads of step s + 2 are issued right after step s's MMAs,
// so while a warp multiplies one stage the other is in flight (the same 16 loads per lane at
// U = 4 as v2's one stage at U = 8, never zero outstanding until the last step).
template <int NT, int U, int W, bool PIPE, class E, bool XPRED = true>
__global__ void __launch_bounds__(W * 32, 16 / W)
    gemv_mma_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, int m_actual, int64_t N, int64_t K, E epi) {
  __shared__ float red[W][16][8 * NT + 1];  // per-warp partial (16 rows x 8*NT activation rows)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int64_t lo0, hi0;
  epi.rows(blockIdx.x, lo0, hi0);
  if constexpr (kEpiPrefetches<E>) epi.prefetch(lo0);  // AddNormRows: its norm weights and residual into L2
  const int64_t n_chunks = K / 8;
  const uint4* w_lo = reinterpret_cast<const uint4*>(w + imin64(lo0 + g, N - 1) * K);
  const uint4* w_hi = reinterpret_cast<const uint4*>(w + imin64(hi0 + g, N - 1) * K);
  const uint4* xr[NT];
  bool x_ok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    x_ok[j] = 8 * j + g < m_actual;
    xr[j] = reinterpret_cast<const uint4*>(x + (x_ok[j] ? (8 * j + g) * K : 0));
  }

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  constexpr int kStep = 4 * U;  // chunks per warp step
  const int64_t stride = int64_t(W) * kStep;
  // Launched with PDL (launch_gemv_mma), the blocks become resident while the kernel before this
  // one (rmsnorm, the attention combine, the previous GEMV's last wave) still runs: each warp
  // issues its first weight loads (its first step; PIPE: its first two) (so W must be memory no
  // kernel of the step writes: model weights, never a scratch filled just before) and only then
  // waits for that kernel (pdl_wait) before it reads x. Then the kernel after this one (the decode
  // attention after the fused qkv GEMV, the next GEMV) may be launched: it touches nothing this one
  // writes before its own pdl_wait.
  // Loop bounds are warp-uniform (mma.sync needs the whole warp); lane t's chunks are base + t + 4u.
  const int64_t first = int64_t(warp) * kStep + t;
  static_assert(!PIPE || XPRED, "the pipelined loop reads x with the predicated load only");
  if constexpr (PIPE) {
    WeightStage<U> s0, s1;
    s0.load(w_lo, w_hi, first, n_chunks);
    s1.load(w_lo, w_hi, first + stride, n_chunks);
    pdl_wait();
    if (epi_releases_early(epi)) pdl_launch_dependents();
    for (int64_t base = first; base - t < n_chunks; base += 2 * stride) {
      gemv_mma_step<NT, U>(acc, s0, xr, x_ok, base, n_chunks);
      if (base + stride - t >= n_chunks) break;
      s0.load(w_lo, w_hi, base + 2 * stride, n_chunks);
      gemv_mma_step<NT, U>(acc, s1, xr, x_ok, base + stride, n_chunks);
      s1.load(w_lo, w_hi, base + 3 * stride, n_chunks);
    }
  } else {
    bool waited = false;
    for (int64_t base = first; base - t < n_chunks; base += stride) {
      WeightStage<U> a;
      a.load(w_lo, w_hi, base, n_chunks);  // every weight load first: they are what the kernel waits on
      if (!waited) {
        pdl_wait();
        if (epi_releases_early(epi)) pdl_launch_dependents();
        waited = true;
      }
      gemv_mma_step<NT, U, XPRED>(acc, a, xr, x_ok, base, n_chunks);
    }
    if (!waited) {  // a warp with no K steps (K / 8 <= warp * kStep): the epilogue's inputs need the wait too
      pdl_wait();
      if (epi_releases_early(epi)) pdl_launch_dependents();
    }
  }
  gemv_stash<W, NT>(red, warp, g, t, acc);
  epi.template finish<W, NT>(red, W, lo0, hi0, m_actual, N);
}

// Which main loop launch_gemv_mma runs: gemv.cu's v2 (plain: the default everywhere) or its v4
// (pipelined), a lab version: it lost to v2 on every shape (session 7, docs/performance/gemv.md,
// with v4's variants that were tried and removed).
enum class GemvLoop { plain, pipelined };

// Chunk groups per warp step of the plain loop (U) at two n-tiles (M = 9..16) for K / 8 = n_chunks
// chunks over `warps` warps: 6 or 4, the one whose busiest warp (warp 0: it takes chunks
// 4U (s warps + 0) .. + 4U - 1 of every step s) loads the fewer chunks, 6 on a tie (more bytes in
// flight a warp). A stride that does not divide K leaves a last step to a few warps while the rest
// of the SM idles: down at M = 16 (K / 8 = 1792, U = 6, 8 warps, a stride of 192) took 10 steps on 3
// warps and 9 on the other 5; U = 4 gives every warp 14. One n-tile keeps U = 8: the same rule with
// 7 as the other choice made Qwen2.5-7B's down and lm_head slower and its tg128 4% slower (H200,
// session 12: docs/performance/gemv.md). KILN_GEMV_STEP_GROUPS=6 or 4 forces U (same-binary
// comparisons).
inline int gemv_two_tile_step_groups(int64_t n_chunks, int warps) {
  static const int forced = env_int("KILN_GEMV_STEP_GROUPS", 0);
  if (forced == 6 || forced == 4) return forced;
  auto busiest = [&](int u) {
    const int64_t step = 4 * u, stride = int64_t(warps) * step, full = n_chunks / stride;
    return full * step + std::min(step, n_chunks - full * stride);
  };
  return busiest(4) < busiest(6) ? 4 : 6;
}

// The plain loop's three launch shapes for one U (see launch_gemv_mma).
template <int NT, int U, class E>
void launch_gemv_mma_plain(bool pdl, bool eight_warp_blocks, bool one_wave, dim3 grid, const bf16* x, const bf16* w,
                           int m, int64_t N, int64_t K, const E& epi, cudaStream_t stream) {
  if (eight_warp_blocks)
    launch_maybe_pdl(pdl, gemv_mma_kernel<NT, U, 8, false, E>, grid, dim3(8 * 32), 0, stream, x, w, m, N, K, epi);
  else if (one_wave)  // one wave of 4-warp blocks: x behind a branch
    launch_maybe_pdl(pdl, gemv_mma_kernel<NT, U, 4, false, E, false>, grid, dim3(4 * 32), 0, stream, x, w, m, N, K,
                     epi);
  else
    launch_maybe_pdl(pdl, gemv_mma_kernel<NT, U, 4, false, E>, grid, dim3(4 * 32), 0, stream, x, w, m, N, K, epi);
}

// A launch over `blocks` 16-row blocks: 16 warps fit per SM (<= 128 registers). A grid that fits
// in two blocks per SM takes 8-warp blocks (o, down: 256 blocks -> 16 warps on each SM); larger
// grids take 4-warp blocks, so up to 4 are resident per SM and a grid of <= 4 blocks per SM (qkv:
// 384) runs in one wave. Plain loop: U = 8 chunk groups per step for one n-tile, 6 or 4 for two
// (the second tile's x fragments would push U = 8 past 128 registers: ptxas spilled), as
// gemv_two_tile_step_groups picks. Pipelined: two stages of U = 4 (one n-tile) or 3 (two).
template <int NT, class E>
void launch_gemv_mma(const bf16* x, const bf16* w, int m, int64_t N, int64_t K, int64_t blocks, const E& epi,
                     cudaStream_t stream, GemvLoop loop = GemvLoop::plain) {
  const bool pdl = gemv_pdl_enabled();
  const bool eight_warp_blocks = blocks <= 2 * int64_t(device_sm_count());  // a small grid
  const dim3 grid{unsigned(blocks)};
  if (loop == GemvLoop::pipelined) {
    constexpr int U = NT == 1 ? 4 : 3;
    if (eight_warp_blocks)
      launch_maybe_pdl(pdl, gemv_mma_kernel<NT, U, 8, true, E>, grid, dim3(8 * 32), 0, stream, x, w, m, N, K, epi);
    else
      launch_maybe_pdl(pdl, gemv_mma_kernel<NT, U, 4, true, E>, grid, dim3(4 * 32), 0, stream, x, w, m, N, K, epi);
    return;
  }
  const bool one_wave = blocks <= 4 * int64_t(device_sm_count());
  if constexpr (NT == 1)
    launch_gemv_mma_plain<1, 8>(pdl, eight_warp_blocks, one_wave, grid, x, w, m, N, K, epi, stream);
  else if (gemv_two_tile_step_groups(K / 8, eight_warp_blocks ? 8 : 4) == 4)
    launch_gemv_mma_plain<2, 4>(pdl, eight_warp_blocks, one_wave, grid, x, w, m, N, K, epi, stream);
  else
    launch_gemv_mma_plain<2, 6>(pdl, eight_warp_blocks, one_wave, grid, x, w, m, N, K, epi, stream);
}

}  // namespace kiln::cuda
