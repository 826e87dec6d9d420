// Decode GEMV on Hopper (sm_90a), gemv.cu's versions 5 and 6 (v6, persistent: further down):
// y(M, N) = x(M, K) . W(N, K)^T for M <= 16, the weights streamed by TMA into a shared-memory ring
// and multiplied by wgmma with W as the A operand ("swap AB": 64 weight rows per wgmma, the <= 16
// activation rows as its n8 / n16 B operand). Lab versions: whether they beat v2 is what the kernel
// lab measures.
//
// Why (docs/performance/gemv.md, session 10): v2 loads W into registers, 64-byte pieces of 8 rows
// per warp instruction, and stops at 99-104% of the copy kernel on gate_up and lm_head where
// cuBLAS reaches 105-111% in the same run; at M = 16 every one of v2's blocks of 16 weight rows
// re-reads all of x from L2 (as many bytes as W) and cuBLAS is 10-15% ahead on gate_up / down.
// Here a block owns 128 weight rows: one TMA box of (128 rows, 64 K) per stage is 128 runs of 128
// contiguous bytes, the x box (NB rows, 64 K) is shared by all 128 rows (x traffic = W / 8 at
// M = 16), and the bytes in flight are the ring's (STAGES x 16 KB a block), held in shared memory,
// not registers.
//
// Block: 160 threads. Warps 0-3 are the consumer warpgroup: per 64-wide K step, 4 k16 slices x 2
// wgmma m64nNBk16 (weight rows 0-63 and 64-127 of the tile). Warp 4 is the producer: one thread
// issues the TMA boxes. Ring protocol as gemm_wgmma.cu (full[s]: arrive.expect_tx + the TMA bytes;
// empty[s]: the consumer releases a stage once the wgmmas reading it have retired, one group kept
// in flight). Tails: TMA zero-fills boxes past N, K and M (the transaction count is the full box);
// the epilogue masks.
//
// Grid (T, S): T = ceil(N / 128) row tiles, S K-splits (1..8, from N, K and the SM count only, not
// M: a row gets the same bits at every M that takes the same NB). The S blocks of a row tile are
// one thread-block cluster (1, S, 1); each stashes its (NB, 128) fp32 partial in its shared memory,
// and after a cluster barrier block r sums rows [r R, r R + R) (R = ceil(128 / S)) over the S
// partials in split order through distributed shared memory (ld.shared::cluster), adds the bias
// and stores per OutMode: deterministic, no workspace, no second launch. S fills about one wave:
// min(8, blocks resident per SM x SMs / T), each split >= 2 K steps.
//
// PDL (as the other decode GEMVs, pdl.cuh): the producer issues its first STAGES weight boxes, then
// waits for the previous kernel, then issues x's boxes; every thread waits before it writes or
// reads anything the previous kernel may touch.
//
// Predicted (H200): W streamed at or above v2's rate on gate_up / down / lm_head at M = 1 and
// nearly flat in M (x traffic W / 8 at M = 16, from L2); qkv / o: per-launch ramp as v2.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/gemv_wgmma.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace kiln::cuda {
namespace {

constexpr int GW_BM = 128;        // weight rows per block: two m64 wgmmas per k16 slice
constexpr int GW_BK = 64;         // K per stage: 128-byte rows, the 128B swizzle
constexpr int GW_THREADS = 160;   // consumer warpgroup (warps 0-3) + producer warp (4)
constexpr int GW_MAX_SPLITS = 8;  // portable cluster size
// Ring depth. 4 (2-3 blocks per SM) measured faster than 8 (1 per SM) on every shape (session 10
// run 1, M = 1: o 15.2 vs 17.3 us, down 34.9 vs 41.2, gate_up 60.8 vs 64.4).
constexpr int kStages = 4;

template <int NB, int STAGES>
struct GwCfg {
  static constexpr int kABytes = GW_BM * GW_BK * 2;  // (128, 64) bf16 = 16 KB
  static constexpr int kBBytes = NB * GW_BK * 2;     // (NB, 64) bf16: 1 or 2 KB (1024-byte atoms)
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kRedStride = GW_BM + 4;  // floats per activation row of the stashed partial
  static constexpr int kRedBytes = NB * kRedStride * 4;
  // STAGES x A, STAGES x B, full[STAGES] and empty[STAGES], + 1 KB to align the base (v6); v5 adds
  // its stashed partial.
  // (an enum: nvcc warns of unused static members, and each version uses one of the two)
  enum : int { kRingSmemBytes = STAGES * kStageBytes + 2 * STAGES * 8 + 1024, kSmemBytes = kRingSmemBytes + kRedBytes };
  static_assert(NB == 8 || NB == 16, "wgmma n8 / n16");
  static_assert(kBBytes % 1024 == 0 && kRedBytes % 8 == 0, "aligned atoms and barriers");
};

#ifdef KILN_WGMMA_DEVICE
using namespace wgmma_ptx;

// The ring's barriers (full[s]: the producer's expect_tx + the TMA bytes; empty[s]: the consumer's
// release), initialized by thread 0 before a __syncthreads.
__device__ __forceinline__ void init_ring(uint32_t full0, uint32_t empty0, int stages) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
}

// One 64-wide K step of the consumer warpgroup on stage s: 4 k16 slices x the two m64 halves of the
// 128 weight rows, issued as one wgmma group; returns once the previous step's group has retired
// (so its stage may be released).
template <int NB>
__device__ __forceinline__ void mma_step(float (&acc)[2][NB / 2], uint32_t a_stage, uint32_t b_stage) {
  const uint64_t da0 = sw128_desc(a_stage);             // weight rows 0-63
  const uint64_t da1 = sw128_desc(a_stage + 64 * 128);  // rows 64-127
  const uint64_t db = sw128_desc(b_stage);
  fence_acc<NB / 2>(acc[0]);
  fence_acc<NB / 2>(acc[1]);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < GW_BK / 16; ++k) {  // +32 bytes per k16 slice
    wgmma_bn<NB>(acc[0], da0 + 2 * k, db + 2 * k);
    wgmma_bn<NB>(acc[1], da1 + 2 * k, db + 2 * k);
  }
  wgmma_commit();
  wgmma_wait<1>();
  fence_acc<NB / 2>(acc[0]);
  fence_acc<NB / 2>(acc[1]);
}
#endif

// acc[h][4j + e] of consumer thread (warp, lane): weight row 64h + 16 warp + lane / 4 + 8 (e >> 1)
// of the tile, activation row 8j + 2 (lane % 4) + (e & 1) (the m64nN accumulator layout,
// gemm_wgmma.cu's header). f(row, act, value) for each.
template <int NB, class F>
__device__ __forceinline__ void for_each_acc(const float (&acc)[2][NB / 2], int warp, int lane, F&& f) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < NB / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        f(64 * h + 16 * warp + lane / 4 + 8 * (e >> 1), 8 * j + 2 * (lane % 4) + (e & 1), acc[h][4 * j + e]);
}

template <int NB, int STAGES>
__global__ void __launch_bounds__(GW_THREADS)
    gemv_wgmma_kernel(const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_x,
                      const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode, int m_actual, int64_t N,
                      int64_t K, int steps_per_split, int splits) {
#ifdef KILN_WGMMA_DEVICE
  using C = GwCfg<NB, STAGES>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sa0 = smem_u32(smem);              // STAGES x W box (128, 64)
  const uint32_t sb0 = sa0 + STAGES * C::kABytes;   // STAGES x x box (NB, 64)
  const uint32_t red0 = sb0 + STAGES * C::kBBytes;  // (NB, kRedStride) fp32 partial
  const uint32_t full0 = red0 + C::kRedBytes;
  const uint32_t empty0 = full0 + STAGES * 8;
  float* red = reinterpret_cast<float*>(smem + (red0 - sa0));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n0 = int64_t(blockIdx.x) * GW_BM;
  const int total_steps = int((K + GW_BK - 1) / GW_BK);
  const int kt0 = int(blockIdx.y) * steps_per_split;
  const int n_steps = max(0, min(total_steps - kt0, steps_per_split));

  init_ring(full0, empty0, STAGES);

  if (warp == 4) {  // producer
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
      const int pre = min(STAGES, n_steps);
      for (int st = 0; st < pre; ++st) {  // weights: no kernel of the step writes them
        mbar_arrive_expect_tx(full0 + 8 * st, C::kStageBytes);
        tma_load_2d(sa0 + st * C::kABytes, &map_w, full0 + 8 * st, (kt0 + st) * GW_BK, int(n0));
      }
      pdl_wait();
      pdl_launch_dependents();
      for (int st = 0; st < pre; ++st)
        tma_load_2d(sb0 + st * C::kBBytes, &map_x, full0 + 8 * st, (kt0 + st) * GW_BK, 0);
      for (int st = pre; st < n_steps; ++st) {
        const int s = st % STAGES;
        mbar_wait(empty0 + 8 * s, (uint32_t(st / STAGES) & 1) ^ 1);
        mbar_arrive_expect_tx(full0 + 8 * s, C::kStageBytes);
        tma_load_2d(sa0 + s * C::kABytes, &map_w, full0 + 8 * s, (kt0 + st) * GW_BK, int(n0));
        tma_load_2d(sb0 + s * C::kBBytes, &map_x, full0 + 8 * s, (kt0 + st) * GW_BK, 0);
      }
    } else {
      pdl_wait();
      pdl_launch_dependents();
    }
  } else {  // consumer warpgroup
    pdl_wait();
    pdl_launch_dependents();
    float acc[2][NB / 2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < NB / 2; ++i) acc[h][i] = 0.0f;
    for (int st = 0; st < n_steps; ++st) {
      const int s = st % STAGES;
      mbar_wait(full0 + 8 * s, uint32_t(st / STAGES) & 1);
      mma_step<NB>(acc, sa0 + s * C::kABytes, sb0 + s * C::kBBytes);  // step st - 1 has retired
      if (st > 0 && threadIdx.x == 0) mbar_arrive(empty0 + 8 * ((st - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_acc<NB / 2>(acc[0]);
    fence_acc<NB / 2>(acc[1]);
    for_each_acc<NB>(acc, warp, lane, [&](int row, int act, float v) { red[act * C::kRedStride + row] = v; });
  }

  // Every block's partial is stashed (release), then block r reduces its share of the rows over
  // the S partials in split order (acquire), then a second barrier keeps each block's shared
  // memory alive until its peers have read it.
  cluster_sync();
  const int rank = int(cluster_ctarank());
  const int rows_per_rank = (GW_BM + splits - 1) / splits;
  const int r_lo = rank * rows_per_rank;
  for (int i = threadIdx.x; i < rows_per_rank * m_actual; i += GW_THREADS) {
    const int row = r_lo + i % rows_per_rank, act = i / rows_per_rank;
    const int64_t n = n0 + row;
    if (row >= GW_BM || n >= N) continue;
    float v = bias ? __bfloat162float(bias[n]) : 0.0f;
    const uint32_t off = red0 + uint32_t(act * C::kRedStride + row) * 4;
    for (int q = 0; q < splits; ++q) v += ld_cluster_f32(mapa_shared(off, uint32_t(q)));
    store_out(y, mode, int64_t(act) * N + n, v);
  }
  cluster_sync();
#else
  __trap();  // not built for sm_90a: the host never launches this (HopperProbe)
#endif
}

template <int NB, int STAGES>
struct GwKernel {
  using C = GwCfg<NB, STAGES>;
  static constexpr auto kernel = gemv_wgmma_kernel<NB, STAGES>;
  // Blocks of this kernel resident per SM (its shared memory bounds it); 0 if it cannot run.
  static int per_sm() {
    static const int v = [] {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes) != cudaSuccess)
        return 0;
      int n = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, GW_THREADS, C::kSmemBytes) != cudaSuccess) return 0;
      return n;
    }();
    return v;
  }
};

int gemv_wgmma_sms() {
  static wgmma_ptx::HopperProbe probe;
  return probe.sms(GwCfg<16, kStages>::kSmemBytes,
                   {reinterpret_cast<const void*>(gemv_wgmma_kernel<8, kStages>),
                    reinterpret_cast<const void*>(gemv_wgmma_kernel<16, kStages>)});
}

// K splits for T row tiles of `steps` K steps: fill about one wave of `slots` resident blocks,
// each split >= 2 steps, <= GW_MAX_SPLITS; no empty split. KILN_GEMV_WGMMA_SPLITS overrides (lab).
int plan_splits(int64_t tiles, int steps, int slots) {
  static const int forced = int(env_int("KILN_GEMV_WGMMA_SPLITS", 0));
  int s = forced > 0 ? forced : int(std::max<int64_t>(1, slots / std::max<int64_t>(tiles, 1)));
  s = std::min({s, GW_MAX_SPLITS, std::max(1, forced > 0 ? steps : steps / 2)});
  const int per = (steps + s - 1) / s;
  return (steps + per - 1) / per;
}

template <int NB, int STAGES>
bool launch(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m, int64_t N, int64_t K,
            cudaStream_t stream) {
  using G = GwKernel<NB, STAGES>;
  const int per_sm = G::per_sm(), sms = gemv_wgmma_sms();
  if (per_sm <= 0 || sms <= 0) return false;
  CUtensorMap mw, mx;
  if (!wgmma_make_map(&mw, w, N, K, GW_BM) || !wgmma_make_map(&mx, x, m, K, NB)) return false;
  const int64_t tiles = (N + GW_BM - 1) / GW_BM;
  const int steps = int((K + GW_BK - 1) / GW_BK);
  const int splits = plan_splits(tiles, steps, per_sm * sms);
  const int per = (steps + splits - 1) / splits;

  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = unsigned(splits);
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(tiles), unsigned(splits), 1);
  cfg.blockDim = dim3(GW_THREADS, 1, 1);
  cfg.dynamicSmemBytes = G::C::kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = gemv_pdl_enabled() ? 2 : 1;
  // A cluster of `splits` blocks may not be schedulable (a partitioned GPU): launch nothing then,
  // and let the caller fall back. Asked once per split count, not per call.
  static std::atomic<int> schedulable[GW_MAX_SPLITS + 1] = {};  // 0 unknown, 1 yes, 2 no
  if (schedulable[splits].load(std::memory_order_relaxed) == 0) {
    int clusters = 0;
    const bool ok = cudaOccupancyMaxActiveClusters(&clusters, G::kernel, &cfg) == cudaSuccess && clusters >= 1;
    if (!ok) (void)cudaGetLastError();
    schedulable[splits].store(ok ? 1 : 2, std::memory_order_relaxed);
  }
  if (schedulable[splits].load(std::memory_order_relaxed) != 1) return false;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, G::kernel, mw, mx, bias, y, mode, m, N, K, per, splits));
  return true;
}

// ---- v6: the same tiles in a persistent grid with a deep ring (what cuBLAS runs for these shapes) ----
//
// ncu on cuBLAS's bf16 GEMV shapes (session 10, call 5: cublasGemmEx as the lab calls it) shows
// nvjet_sm90_tst_128x8_64x12 (gate_up M = 1), 128x16_64x11 (M = 16), 256x8_64x6 (lm_head) and
// split-K 128x8 / 64x8 kernels plus a separate reduce launch (down, o): one block per SM
// (grid 132), TMA into an 11-12 stage ring of ~220 KB, W rows as the wgmma M dimension. v5 had
// the tiles but 4 stages, 2-3 short-lived blocks per SM and a cluster barrier per block.
// v6 keeps v5's tile (128 weight rows x NB activation rows, 64-wide K steps) in one block per SM
// with a 12-stage ring that runs on across the block's work units, so the producer streams the
// next unit's weights while the consumer finishes a unit. Units are (row tile, K split), split
// count S from N, K and the SM count only (the rounds of units times the steps of one, smallest S
// on a tie; not M). S > 1: each unit's fp32 partial goes to a static workspace and the last unit
// of a tile to arrive (atomic counter, reset by that unit) sums the S partials in split order, adds
// the bias and stores: deterministic, no second launch. Under PDL the producer issues the first 12
// stages' weight boxes (192 KB a block) before it waits for the previous kernel, then their x boxes.
// Not safe for two v6 launches running at once on different streams (they share the workspace).
constexpr int kPStages = 12;
constexpr int kPMaxSplits = 16;
constexpr int kPMaxTiles = 8192;                             // row tiles of a split launch
constexpr int64_t kPWorkspaceFloats = int64_t(4) << 20;      // 16 MB: S x 16 x N of a split launch
__device__ float g_v6_part[kPWorkspaceFloats];
__device__ unsigned g_v6_count[kPMaxTiles];

template <int NB>
__global__ void __launch_bounds__(GW_THREADS, 1)
    gemv_wgmma_persistent_kernel(const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_x,
                                 const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode, int m_actual,
                                 int64_t N, int64_t K, int splits, int steps_per_split, int units) {
#ifdef KILN_WGMMA_DEVICE
  using C = GwCfg<NB, kPStages>;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int last_flag;
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sa0 = smem_u32(smem);
  const uint32_t sb0 = sa0 + kPStages * C::kABytes;
  const uint32_t full0 = sb0 + kPStages * C::kBBytes;
  const uint32_t empty0 = full0 + kPStages * 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int total_steps = int((K + GW_BK - 1) / GW_BK);

  init_ring(full0, empty0, kPStages);

  if (warp == 4) {  // producer
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
      int kx[kPStages];  // K coordinates of the steps issued before the wait (their x boxes follow it)
      bool waited = false;
      int g = 0;  // steps issued by this block
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const int tile = u / splits, kt0 = (u % splits) * steps_per_split;
        const int n = min(total_steps - kt0, steps_per_split);
        for (int st = 0; st < n; ++st, ++g) {
          if (!waited && g == kPStages) {
            pdl_wait();
            pdl_launch_dependents();
            for (int i = 0; i < kPStages; ++i) tma_load_2d(sb0 + i * C::kBBytes, &map_x, full0 + 8 * i, kx[i], 0);
            waited = true;
          }
          const int s = g % kPStages;
          mbar_wait(empty0 + 8 * s, (uint32_t(g / kPStages) & 1) ^ 1);
          mbar_arrive_expect_tx(full0 + 8 * s, C::kStageBytes);
          const int k = (kt0 + st) * GW_BK;
          tma_load_2d(sa0 + s * C::kABytes, &map_w, full0 + 8 * s, k, tile * GW_BM);
          if (waited)
            tma_load_2d(sb0 + s * C::kBBytes, &map_x, full0 + 8 * s, k, 0);
          else
            kx[g] = k;
        }
      }
      if (!waited) {
        pdl_wait();
        pdl_launch_dependents();
        for (int i = 0; i < g; ++i) tma_load_2d(sb0 + i * C::kBBytes, &map_x, full0 + 8 * i, kx[i], 0);
      }
    } else {
      pdl_wait();
      pdl_launch_dependents();
    }
    return;
  }

  // Consumer warpgroup.
  pdl_wait();
  pdl_launch_dependents();
  int g = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int tile = u / splits, split = u % splits, kt0 = split * steps_per_split;
    const int n = min(total_steps - kt0, steps_per_split);
    float acc[2][NB / 2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < NB / 2; ++i) acc[h][i] = 0.0f;
    for (int st = 0; st < n; ++st, ++g) {
      const int s = g % kPStages;
      mbar_wait(full0 + 8 * s, uint32_t(g / kPStages) & 1);
      mma_step<NB>(acc, sa0 + s * C::kABytes, sb0 + s * C::kBBytes);  // the previous step has retired
      if (st > 0 && threadIdx.x == 0) mbar_arrive(empty0 + 8 * ((g - 1) % kPStages));
    }
    wgmma_wait<0>();
    fence_acc<NB / 2>(acc[0]);
    fence_acc<NB / 2>(acc[1]);
    if (threadIdx.x == 0) mbar_arrive(empty0 + 8 * ((g - 1) % kPStages));  // the unit's last step

    const int64_t n0 = int64_t(tile) * GW_BM;
    if (splits == 1) {
      for_each_acc<NB>(acc, warp, lane, [&](int r, int act, float v) {
        const int64_t row = n0 + r;
        if (act < m_actual && row < N)
          store_out(y, mode, int64_t(act) * N + row, v + (bias ? __bfloat162float(bias[row]) : 0.0f));
      });
      continue;
    }
    for_each_acc<NB>(acc, warp, lane, [&](int r, int act, float v) {
      const int64_t row = n0 + r;
      if (act < m_actual && row < N) g_v6_part[(int64_t(split) * m_actual + act) * N + row] = v;
    });
    __threadfence();
    named_bar_sync(1, 128);
    if (threadIdx.x == 0) last_flag = atomicAdd(&g_v6_count[tile], 1u) == unsigned(splits - 1);
    named_bar_sync(1, 128);
    if (!last_flag) continue;
    __threadfence();
    // Thread r sums row n0 + r for every activation row, split by split in order; the loads of 4
    // splits x NB rows are issued together (a split at a time was a chain of L2 round trips).
    const int64_t row = n0 + threadIdx.x;
    if (row < N) {
      float v[NB];
#pragma unroll
      for (int a = 0; a < NB; ++a) v[a] = bias ? __bfloat162float(bias[row]) : 0.0f;
      for (int q0 = 0; q0 < splits; q0 += 4) {
        float part[4][NB];
#pragma unroll
        for (int dq = 0; dq < 4; ++dq)
#pragma unroll
          for (int a = 0; a < NB; ++a)
            part[dq][a] = q0 + dq < splits && a < m_actual
                              ? __ldcg(&g_v6_part[(int64_t(q0 + dq) * m_actual + a) * N + row])
                              : 0.0f;
#pragma unroll
        for (int dq = 0; dq < 4; ++dq)
#pragma unroll
          for (int a = 0; a < NB; ++a)
            if (q0 + dq < splits) v[a] += part[dq][a];
      }
#pragma unroll
      for (int a = 0; a < NB; ++a)
        if (a < m_actual) store_out(y, mode, int64_t(a) * N + row, v[a]);
    }
    if (threadIdx.x == 0) g_v6_count[tile] = 0;  // for the next launch
  }
#else
  (void)g_v6_part;
  (void)g_v6_count;
  __trap();  // not built for sm_90a: the host never launches this (HopperProbe)
#endif
}

// (S, steps per split) for T row tiles of `steps` K steps on `blocks` persistent blocks: the fewest
// rounds-of-units x steps-per-unit, the smallest S on a tie; S x 16 x N must fit the workspace and
// T the counters (else S = 1). KILN_GEMV_WGMMA_SPLITS (lab) makes it the only candidate; where it
// does not fit, S = 1.
void plan_persistent(int64_t tiles, int64_t N, int steps, int blocks, int& splits, int& per) {
  static const int forced = int(env_int("KILN_GEMV_WGMMA_SPLITS", 0));
  const int lo = forced > 0 ? forced : 1, hi = forced > 0 ? forced : kPMaxSplits;
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int s = lo; s <= hi && s <= steps; ++s) {
    if (s > 1 && (tiles > kPMaxTiles || int64_t(s) * 16 * N > kPWorkspaceFloats)) break;
    const int p = (steps + s - 1) / s;
    if ((steps + p - 1) / p != s) continue;  // an empty split
    const int64_t cost = ((tiles * s + blocks - 1) / blocks) * p;
    if (cost < best_cost) best_cost = cost, best = s;
  }
  per = (steps + best - 1) / best;
  splits = (steps + per - 1) / per;
}

template <int NB>
bool launch_persistent_gemv(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m, int64_t N,
                            int64_t K, cudaStream_t stream) {
  using C = GwCfg<NB, kPStages>;
  const auto kernel = gemv_wgmma_persistent_kernel<NB>;
  static const bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              C::kRingSmemBytes) == cudaSuccess;
  const int sms = gemv_wgmma_sms();
  if (!ok || sms <= 0) return false;
  CUtensorMap mw, mx;
  if (!wgmma_make_map(&mw, w, N, K, GW_BM) || !wgmma_make_map(&mx, x, m, K, NB)) return false;
  const int64_t tiles = (N + GW_BM - 1) / GW_BM;
  const int steps = int((K + GW_BK - 1) / GW_BK);
  int splits = 1, per = steps;
  plan_persistent(tiles, N, steps, sms, splits, per);
  const int64_t units = tiles * splits;
  if (units >= (int64_t(1) << 31)) return false;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(std::min<int64_t>(units, sms)), 1, 1);
  cfg.blockDim = dim3(GW_THREADS, 1, 1);
  cfg.dynamicSmemBytes = C::kRingSmemBytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = gemv_pdl_enabled() ? 1 : 0;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, mw, mx, bias, y, mode, m, N, K, splits, per, int(units)));
  return true;
}

// What both versions need: 1..16 activation rows, the wgmma shape and alignment limits, an sm_90a
// device and binary.
bool gemv_wgmma_can_run(const bf16* x, const bf16* w, int64_t M, int64_t N, int64_t K) {
  return M >= 1 && M <= 16 && wgmma_shape_ok(x, w, M, N, K) && (N + GW_BM - 1) / GW_BM < (int64_t(1) << 31) &&
         gemv_wgmma_sms() > 0;
}

}  // namespace

bool gemv_wgmma_persistent(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                           int64_t K, cudaStream_t stream) {
  if (!gemv_wgmma_can_run(x, w, M, N, K)) return false;
  const int m = int(M);
  return m <= 8 ? launch_persistent_gemv<8>(x, w, bias, y, mode, m, N, K, stream)
                : launch_persistent_gemv<16>(x, w, bias, y, mode, m, N, K, stream);
}

bool gemv_wgmma(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                int64_t K, cudaStream_t stream) {
  if (!gemv_wgmma_can_run(x, w, M, N, K)) return false;
  const int m = int(M);
  return m <= 8 ? launch<8, kStages>(x, w, bias, y, mode, m, N, K, stream)
                : launch<16, kStages>(x, w, bias, y, mode, m, N, K, stream);
}

}  // namespace kiln::cuda
