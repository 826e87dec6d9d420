// The persistent wgmma + TMA GEMM kernel (gemm v5) and its configurations: the tile shape, ring
// depth and epilogue of each PCfg, the tile walk and the producer / consumer warpgroups. The design,
// and why each configuration exists, is in gemm_wgmma_persistent.cu's header; that file holds the
// host side (the plan, the tensor maps, the launches) and is the only one to include this: the
// definitions sit in an anonymous namespace.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/cuda/epilogue_add.cuh"
#include "kernels/cuda/gemm_argmax_epilogue.cuh"
#include "kernels/cuda/gemm_rope_epilogue.cuh"
#include "kernels/cuda/gemm_tma_epilogue.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/pointwise_math.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace kiln::cuda {
namespace {

constexpr int P_BM = 128, P_BK = 64, P_THREADS = 384;  // 1 producer + 2 consumer warpgroups

template <int BN_, int STAGES_, bool PP_, bool TMA_EPI_ = false, bool SWIGLU_ = false, bool ADD_ = false,
          bool FP8_ = false, bool ARGMAX_ = false, int ROPE_ = 0>
struct PCfg {
  static constexpr int BN = BN_, STAGES = STAGES_;
  static constexpr bool PP = PP_, TMA_EPI = TMA_EPI_;
  // FP8 (session 11, gemm_wgmma_fp8): e4m3 x and W (W8A8), one scale per x row and per W row applied
  // to the fp32 accumulators before the epilogue. A K step is 128 bytes of a row either way (64 bf16
  // or 128 e4m3 values), so the ring, the swizzle, the descriptors and the 4 wgmmas a step are the
  // bf16 kernel's; only the instruction (k32 e4m3 for k16 bf16) and BK in elements differ.
  static constexpr bool FP8 = FP8_;
  static constexpr int BK = FP8 ? 2 * P_BK : P_BK;  // K elements per 128-byte step
  // ADD (configs 9 / 10, session 9; in the plan since session 10): the fp32 add_f32 output
  // (y += x . W^T, the residual adds of o and down) through TMA reduce-adds: each consumer stages
  // (64 rows, 32 columns) fp32 boxes in two 8 KB buffers that take turns, and
  // cp.reduce.async.bulk.tensor adds each box into y.
  static constexpr bool ADD = ADD_;
  static constexpr int kAddBoxCols = 32, kAddBoxBytes = 64 * kAddBoxCols * 4;  // 128-byte rows: 128B swizzle
  // SwiGLU (gemm_wgmma_swiglu): the B tile is gate rows [n0, n0 + BN / 2) over up rows
  // [I + n0, I + n0 + BN / 2), and the tile's output is silu(gate) * up, BN / 2 columns of h.
  static constexpr bool SWIGLU = SWIGLU_;
  // ARGMAX (session 34, gemm_wgmma_argmax): no product leaves the block, only each row's best
  // column of the tile as a (value, id) pair (gemm_argmax_epilogue.cuh); y is the pairs' (M, tiles
  // per row) float2 array. Config 3's tiles and main loop, so the same fp32 products.
  static constexpr bool ARGMAX = ARGMAX_;
  // ROPE (session 35, gemm_wgmma_rope): config 4's tiles and staging, then RoPE and the K/V write
  // from the staged qkv products instead of their store (gemm_rope_epilogue.cuh), by two warps of
  // the producer warpgroup (one a consumer half) while the consumers run the next tile's main
  // loop. 0: off, else 1 + the cache's KvQuant (1 bf16, 2 int8, 3 fp8).
  static constexpr int ROPE = ROPE_;
  enum : int { BN_OUT = SWIGLU ? BN / 2 : BN };  // output columns per tile (an enum: nvcc warns of unused static members)
  static constexpr int MH = PP ? 2 : 1;         // m64 row blocks per consumer per tile
  static constexpr int ACC = MH * BN / 2;       // fp32 accumulators per consumer thread
  static constexpr int kABytes = P_BM * P_BK * 2;  // (128, 64) bf16 = 16 KB
  static constexpr int kBBytes = BN * P_BK * 2;    // (BN, 64) bf16
  static constexpr int kStageBytes = kABytes + kBBytes;
  // TMA-store epilogue: a bf16 (128, BN) staging tile in (64 rows, BOX columns) boxes, BOX = 64
  // (128-byte rows, 128B swizzle, 8 KB) or, where BN is no multiple of 64 (224), 32 (64-byte rows,
  // 64B swizzle, 4 KB).
  static constexpr int BOX = BN % 64 == 0 ? 64 : 32;
  static constexpr int kCBytes = ADD ? 2 * 2 * kAddBoxBytes : TMA_EPI ? P_BM * BN * 2 : 0;
  // ROPE: two more barrier pairs (a consumer's half staged / read by its epilogue warp).
  static constexpr int kSmemBytes = kCBytes + STAGES * kStageBytes + 2 * STAGES * 8 + (ROPE_ ? 32 : 0) + 1024;
  static_assert(BN == 128 || BN == 192 || BN == 224 || BN == 256, "wgmma n128 / n192 / n224 / n256");
  static_assert(MH * 64 * BN / 128 == ACC && ACC <= 128, "fp32 accumulators per consumer thread");
  static_assert(!TMA_EPI || (!PP && BN % BOX == 0), "TMA epilogue: cooperative, whole boxes");
  static_assert(kBBytes % 1024 == 0, "1024-byte aligned swizzle atoms");
  static_assert(kSmemBytes <= 227 * 1024, "opt-in shared memory per block");
  static_assert(!SWIGLU || (TMA_EPI && BN == 256), "SwiGLU: the 128x256 TMA-store configuration only");
  static_assert(!ADD || (TMA_EPI && !SWIGLU && BN % (2 * kAddBoxCols) == 0), "ADD: whole pairs of boxes");
  static_assert(!ARGMAX || (!PP && !TMA_EPI && !FP8 && BN == 256), "ARGMAX: config 3's tiles");
  static_assert(ROPE == 0 || (TMA_EPI && !PP && !SWIGLU && !ADD && !FP8 && !ARGMAX && BN == 256),
                "ROPE: config 4's tiles and staging");
};
using PCfgPP128 = PCfg<128, 7, true>;     // 7 x 32 KB = 224 KB
using PCfgCo192 = PCfg<192, 5, false>;    // 5 x 40 KB = 200 KB
using PCfgCo256 = PCfg<256, 4, false>;    // 4 x 48 KB = 192 KB
using PCfgCo256T = PCfg<256, 3, false, true>;  // 64 KB C staging + 3 x 48 KB = 208 KB
using PCfgCo256TSwiglu = PCfg<256, 3, false, true, true>;  // as PCfgCo256T, gate | up halves, h out
using PCfgCo256Argmax = PCfg<256, 4, false, false, false, false, false, true>;  // as PCfgCo256, (value, id) out
template <KvQuant KV>  // as PCfgCo256T, q and the cache's K/V out
using PCfgCo256TRope = PCfg<256, 3, false, true, false, false, false, false, 1 + int(KV)>;
// Session 9 (lab, gemm v16 / v17): the one-round M = 512 tiles (v4's 128x128, config 2's 128x192)
// with the TMA-store epilogue, to measure what storing from registers costs there.
using PCfgCo128T = PCfg<128, 6, false, true>;  // 32 KB C staging + 6 x 32 KB = 224 KB
using PCfgCo192T = PCfg<192, 4, false, true>;  // 48 KB C staging + 4 x 40 KB = 208 KB
// Session 9 (lab, gemm v18 / v19, written without a GPU): the residual-add output through TMA
// reduce-adds, so the add_f32 products (o, down) get what v9 / v16 gave the bf16 stores.
using PCfgCo256Add = PCfg<256, 4, false, true, false, true>;  // 32 KB staging + 4 x 48 KB = 224 KB
using PCfgCo128Add = PCfg<128, 6, false, true, false, true>;  // 32 KB staging + 6 x 32 KB = 224 KB
// Session 7 (gate_up M = 512: 512 tiles of 128x224 = 3.88 rounds on 132 SMs; see the note below).
using PCfgCo224 = PCfg<224, 5, false>;          // 5 x 44 KB = 220 KB
using PCfgCo224T = PCfg<224, 3, false, true>;   // 56 KB C staging + 3 x 44 KB = 188 KB (4 would be 232)
// Session 11: the fp8 twins of the TMA-epilogue configurations (gemm_wgmma_fp8): the same bytes per
// stage, so the same ring depths.
using PCfgCo128TF8 = PCfg<128, 6, false, true, false, false, true>;
using PCfgCo192TF8 = PCfg<192, 4, false, true, false, false, true>;
using PCfgCo256TF8 = PCfg<256, 3, false, true, false, false, true>;
using PCfgCo256TSwigluF8 = PCfg<256, 3, false, true, true, false, true>;
using PCfgCo256AddF8 = PCfg<256, 4, false, true, false, true, true>;
using PCfgCo128AddF8 = PCfg<128, 6, false, true, false, true, true>;

#ifdef KILN_WGMMA_DEVICE
using namespace wgmma_ptx;
// Named barriers: 1 / 2 the ping-pong hand-over (to consumer 2 / to consumer 1), 3 + c consumer c's
// TMA-store epilogue (128 threads).
constexpr int kBarToWg2 = 1, kBarToWg1 = 2;

using namespace tma_epilogue;
#endif  // KILN_WGMMA_DEVICE

// Tile t's (m tile, n tile): groups of `group` consecutive m tiles, each walked n tile by n tile
// with its m tiles fastest (the last group may be shorter). group >= m_tiles is the plain M-fastest
// order (m = t % m_tiles, n = t / m_tiles).
__device__ __forceinline__ void tile_mn(int t, int m_tiles, int n_tiles, int group, int& mt, int& nt) {
  const int per_group = group * n_tiles, gi = t / per_group, r = t - gi * per_group;
  const int gm0 = gi * group, gsize = min(group, m_tiles - gm0);
  mt = gm0 + r % gsize;
  nt = r / gsize;
}

#ifdef KILN_WGMMA_DEVICE
// ROPE's epilogue warp for consumer c: the block's tiles in the consumers' order; for each, the
// rows' positions and slots first, then the staged half (staged0 + 8c), RoPE and the K/V write,
// and the half handed back (read0 + 8c) for the consumer's next tile.
template <class C>
__device__ __forceinline__ void rope_epilogue_warp(int c, int lane, uint32_t sc0, uint32_t staged0, uint32_t read0,
                                                   int64_t M, int64_t N, int group, const RopeKvTarget& rope) {
  const int m_tiles = int((M + P_BM - 1) / P_BM), n_tiles = int((N + C::BN_OUT - 1) / C::BN_OUT);
  const int tiles = m_tiles * n_tiles, grid = int(gridDim.x);
  const uint32_t sc = sc0 + uint32_t(c) * (C::kCBytes / 2);
  for (int j = 0, t = int(blockIdx.x); t < tiles; ++j, t += grid) {
    int mt, nt;
    tile_mn(t, m_tiles, n_tiles, group, mt, nt);
    const int64_t row0 = int64_t(mt) * P_BM + 64 * c, n0 = int64_t(nt) * C::BN_OUT;
    const rope_epilogue::RowsMeta rm = rope_epilogue::rows_meta(rope, row0, M, lane);
    mbar_wait(staged0 + 8 * c, uint32_t(j) & 1);
    rope_epilogue::rope_block<KvQuant(C::ROPE - 1)>(lane, sc, row0, n0, M, rope, rm);
    __syncwarp();
    if (lane == 0) mbar_arrive(read0 + 8 * c);
  }
}
#endif  // KILN_WGMMA_DEVICE

template <class C>
__global__ void __launch_bounds__(P_THREADS, 1)
    gemm_wgmma_persistent_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                                 const __grid_constant__ CUtensorMap map_y, const bf16* __restrict__ bias,
                                 void* __restrict__ y, OutMode mode, int64_t M, int64_t N, int64_t K,
                                 const float* __restrict__ xs, const float* __restrict__ ws, int group,
                                 const __grid_constant__ RopeKvTarget rope) {
#ifdef KILN_WGMMA_DEVICE
  constexpr int BN = C::BN, STAGES = C::STAGES, MH = C::MH, ACC = C::ACC, BK = C::BK;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sc0 = smem_u32(smem);               // TMA_EPI: C staging (128, BN) bf16, 2 halves
  const uint32_t sa0 = sc0 + C::kCBytes;             // STAGES x A (128, 64)
  const uint32_t sb0 = sa0 + STAGES * C::kABytes;    // STAGES x B (BN, 64)
  const uint32_t full0 = sb0 + STAGES * C::kBBytes;  // STAGES x mbarrier
  const uint32_t empty0 = full0 + STAGES * 8;        // STAGES x mbarrier
  const uint32_t staged0 = empty0 + STAGES * 8;      // ROPE: 2 x mbarrier, consumer c's half staged
  const uint32_t read0 = staged0 + 2 * 8;            // ROPE: 2 x mbarrier, consumer c's half read out
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int m_tiles = int((M + P_BM - 1) / P_BM);
  // SWIGLU: N is the output width I (a multiple of BN_OUT, the host checks); W has 2I rows.
  constexpr int BN_OUT = C::BN_OUT;
  const int n_tiles = int((N + BN_OUT - 1) / BN_OUT);
  const int tiles = m_tiles * n_tiles;  // < 2^31 (the host checks)
  const int k_steps = int((K + BK - 1) / BK);
  const int grid = int(gridDim.x);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);                 // the producer's arrive.expect_tx
      mbar_init(empty0 + 8 * s, C::PP ? 1 : 2);    // the consumer(s) that read the stage
    }
    if constexpr (C::ROPE > 0) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        mbar_init(staged0 + 8 * c, 1);  // the consumer's thread 0, after its warpgroup staged the half
        mbar_init(read0 + 8 * c, 1);    // the epilogue warp's lane 0, after the warp read it
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer: the block's tiles' K steps as one sequence g = 0, 1, ...
    // ROPE's epilogue warps need more than the TMA thread: 120 here, 184 a consumer (no spills).
    if constexpr (C::ROPE > 0)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 120;\n" ::: "memory");
    else
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (C::ROPE > 0 && tid >= 64) {  // warps 2 and 3: the RoPE epilogue of consumer tid / 32 - 2's halves
      rope_epilogue_warp<C>(tid / 32 - 2, tid % 32, sc0, staged0, read0, M, N, group, rope);
    } else if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
      uint32_t g = 0;
      for (int t = blockIdx.x; t < tiles; t += grid) {
        int mt, nt;
        tile_mn(t, m_tiles, n_tiles, group, mt, nt);
        const int m0 = mt * P_BM, n0 = nt * BN_OUT;
        for (int kt = 0; kt < k_steps; ++kt, ++g) {
          const uint32_t s = g % STAGES, use = g / STAGES;
          mbar_wait(empty0 + 8 * s, (use & 1) ^ 1);  // the stage's previous use was released
          mbar_arrive_expect_tx(full0 + 8 * s, C::kStageBytes);
          tma_load_2d(sa0 + s * C::kABytes, &map_x, full0 + 8 * s, kt * BK, m0);  // (128, BK)
          if constexpr (C::SWIGLU) {  // (128, BK) of gate rows, then (128, BK) of the matching up rows
            tma_load_2d(sb0 + s * C::kBBytes, &map_w, full0 + 8 * s, kt * BK, n0);
            tma_load_2d(sb0 + s * C::kBBytes + C::kBBytes / 2, &map_w, full0 + 8 * s, kt * BK, int(N) + n0);
          } else {
            tma_load_2d(sb0 + s * C::kBBytes, &map_w, full0 + 8 * s, kt * BK, n0);  // (BN, BK)
          }
        }
      }
    }
  } else {
    if constexpr (C::ROPE > 0)
      asm volatile("setmaxnreg.inc.sync.aligned.u32 184;\n" ::: "memory");
    else
      asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1;
    const int j0 = C::PP ? c : 0, jstep = C::PP ? 2 : 1;
    const int local_tiles = (tiles - int(blockIdx.x) + grid - 1) / grid;  // tiles of this block
    float acc[ACC];  // PP: (128, BN) as MH = 2 blocks of (64, BN); else (64, BN), rows [64c, 64c + 64)
    for (int j = j0; j < local_tiles; j += jstep) {
      const int t = int(blockIdx.x) + j * grid;
      int mt, nt;
      tile_mn(t, m_tiles, n_tiles, group, mt, nt);
      const int64_t m0 = int64_t(mt) * P_BM, n0 = int64_t(nt) * BN_OUT;
      const uint32_t g0 = uint32_t(j) * uint32_t(k_steps);
      // Ping-pong: wait until the other consumer has issued its tile j - 1 (see the header).
      if (C::PP && j > 0) named_bar_sync(c == 0 ? kBarToWg1 : kBarToWg2, 256);
#pragma unroll
      for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
      for (int kt = 0; kt < k_steps; ++kt) {
        const uint32_t g = g0 + uint32_t(kt), s = g % STAGES;
        mbar_wait(full0 + 8 * s, (g / STAGES) & 1);
        const uint32_t a_base = sa0 + s * C::kABytes + (C::PP ? 0 : c * 64 * 128);
        const uint64_t db = sw128_desc(sb0 + s * C::kBBytes);
        fence_acc<ACC>(acc);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < P_BK / 16; ++k)
#pragma unroll
          for (int h = 0; h < MH; ++h) {
            if constexpr (C::FP8)
              wgmma_bn_e4m3<BN>(acc + h * (BN / 2), sw128_desc(a_base + h * 64 * 128) + 2 * k, db + 2 * k);
            else
              wgmma_bn<BN>(acc + h * (BN / 2), sw128_desc(a_base + h * 64 * 128) + 2 * k, db + 2 * k);
          }
        wgmma_commit();
        wgmma_wait<1>();  // step kt-1's wgmmas have retired: release its stage
        fence_acc<ACC>(acc);
        if (kt > 0 && tid == 0) mbar_arrive(empty0 + 8 * ((g - 1) % STAGES));
      }
      // Hand the tensor cores to the other consumer (it may now wait on the next tile's stages).
      if (C::PP && j + 1 < local_tiles) named_bar_arrive(c == 0 ? kBarToWg2 : kBarToWg1, 256);
      wgmma_wait<0>();
      fence_acc<ACC>(acc);
      if (tid == 0) mbar_arrive(empty0 + 8 * ((g0 + uint32_t(k_steps) - 1) % STAGES));
      static_assert(!C::FP8 || (C::TMA_EPI && !C::PP), "fp8: the cooperative TMA-epilogue configurations");
      AccScale as;  // FP8 and not SWIGLU: folded into the store / reduce-add loops
      if constexpr (C::FP8 && C::SWIGLU)
        scale_acc_fp8_swiglu<BN>(acc, tid, m0 + c * 64, n0, xs, ws, M, 2 * N);
      else if constexpr (C::FP8)
        as = acc_scale(xs, ws, tid, m0 + c * 64, M);
      if constexpr (C::SWIGLU) {
        // Thread columns j (gate, j < BN / 16) and j + BN / 16 (up) are the same h column: silu(g) * u
        // in place over the gate half, each rounded to bf16 first as the unfused path stores them
        // (gemm, then silu_mul): the same bits.
#pragma unroll
        for (int i = 0; i < ACC / 2; ++i) acc[i] = silu_mul_value(round_bf16(acc[i]), round_bf16(acc[i + ACC / 2]));
        store_block_tma<BN_OUT, C::BOX>(acc, tid, c, sc0 + uint32_t(c) * (C::kCBytes / 2), &map_y, m0 + c * 64, n0,
                                        nullptr, M, N);
      } else if constexpr (C::ADD) {
        reduce_add_block_tma<BN, C::FP8 && !C::SWIGLU>(acc, tid, c, sc0 + uint32_t(c) * (C::kCBytes / 2), &map_y,
                                                      m0 + c * 64, n0, bias, M, N, as);
      } else if constexpr (C::ROPE > 0) {
        // Stage the half once its epilogue warp has read the previous tile's out of it; hand it over.
        if (j > 0) mbar_wait(read0 + 8 * c, uint32_t(j - 1) & 1);
        stage_block_bf16<BN, C::BOX>(acc, tid, c, sc0 + uint32_t(c) * (C::kCBytes / 2), n0, bias, N);
        if (tid == 0) mbar_arrive(staged0 + 8 * c);
      } else if constexpr (C::ARGMAX) {
        argmax_acc_block<BN>(acc, tid, m0 + c * 64, n0, nt, n_tiles, M, N, static_cast<float2*>(y));
      } else if constexpr (C::TMA_EPI) {
        store_block_tma<BN, C::BOX, C::FP8 && !C::SWIGLU>(acc, tid, c, sc0 + uint32_t(c) * (C::kCBytes / 2), &map_y,
                                                         m0 + c * 64, n0, bias, M, N, as);
      } else {
#pragma unroll
        for (int h = 0; h < MH; ++h)
          store_acc_block_batched<BN>(acc + h * (BN / 2), tid, m0 + (C::PP ? h : c) * 64, n0, bias, y, mode, M, N);
      }
    }
    // The last tile's boxes must be out of shared memory before the block exits.
    if (C::TMA_EPI && tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }
#else
  __trap();  // not built for sm_90a: the host never launches this (gemm_wgmma_available)
#endif
}

}  // namespace
}  // namespace kiln::cuda
