// Prefill GEMM on Hopper (sm_90a), gemm.cu's version 12: split-K over a 2-CTA thread-block cluster,
// the two partial sums exchanged through distributed shared memory. Same contract as gemm_wgmma.cu
// (v4; its header has the shared layout, descriptors and accumulator layout): y(M, N) = x(M, K) .
// W(N, K)^T (+ bias) per OutMode, bf16 K-major operands, fp32 accumulation, any M and N; K % 8 == 0
// and 16-byte aligned x and W (wgmma_shape_ok). Written untimed (session 7); measured in run 3:
// o M = 512 525.8 TFLOP/s, slower than v4's 588.0 (cuBLAS 659.5), so a lab version only
// (docs/performance/gemm.md, session 7).
//
// Why: the one-round M = 512 shapes. o (N = K = 4096) is 128 tiles of 128x128: one round on 132 SMs,
// and v4 runs it at 0.87x cuBLAS (583 vs 670 TFLOP/s, run 7). A 128x128 tile is the slow main loop
// (ping-pong 128x128 ran at 0.90x the 128x256 rate at M = 4096; per 64-wide K step the SM's shared
// memory takes the TMA's 32 KB and the wgmmas' ~48 KB of operand reads per 128x128x64, against
// 48 KB + 80 KB per 128x256x64: 25% fewer bytes per FLOP with 128x256), and each CTA streams 2 MB
// (A and B over all of K) from L2: 256 MB for the 128 CTAs. 128x256 tiles would be 64 CTAs: half the
// SMs idle. Here each 128x256 tile is computed by a cluster of 2 CTAs that each run half of K with
// the 128x256 cooperative main loop of v4: 128 CTAs again, one round, the faster main loop, and
// 1.5 MB per CTA from L2 (192 MB in all, -25%).
//
// Design: grid (2 x m_tiles, n_tiles), cluster (2, 1, 1), 384 threads (1 TMA producer warpgroup at
// 40 registers, 2 wgmma consumers at 232), 4 stages x 48 KB. CTA rank r (%cluster_ctarank) of the
// pair runs K steps [r x h, min(k_steps, (r + 1) x h)), h = ceil(k_steps / 2) (K = 4096: 32 each;
// k_steps = 1 leaves rank 1 no step: its partial is 0), then owns output columns [128 r, 128 r + 128)
// of the tile. The exchange, symmetric:
//   1. cluster_sync: both CTAs' main loops are done (every consumer waited for its last wgmmas; every
//      TMA load was consumed), so both rings are free.
//   2. Each consumer thread writes the 64 fp32 accumulators of the peer's column half (16 float4:
//      d[4j .. 4j + 3] for the 16 j of that half) into the peer's ring (mapa + st.shared::cluster).
//      The accumulator layout is the same in both CTAs, so thread t (0..255 over the 2 consumers) of
//      one CTA holds the same (row, column) elements as thread t of the other: the buffer needs no
//      addresses, only thread order. Layout float4 buf[16][256] (q-th float4 of thread t at
//      (q x 256 + t) x 16 bytes): a warp writes 512 contiguous bytes per store. 64 KB per CTA.
//   3. cluster_sync (release / acquire at cluster scope: the peer's stores are visible). After it no
//      CTA touches the other's shared memory, so either may exit when done.
//   4. Each consumer thread adds buf[q][t] to its own half's accumulators and stores them (bias,
//      OutMode, the batched residual add: store_acc_block_batched<128>, masks rows >= M, cols >= N).
//   Deterministic: both halves are (K-half 0 partial) + (K-half 1 partial), one fp32 add, and
//   a + b == b + a. Every thread of both CTAs (the producer warpgroup included) passes both barriers.
// Tails: TMA zero-fills K, M and N outside the operands; the epilogue masks; a pair whose column half
// is past N just stores nothing.
//
// Counting (o M = 512, H200): per CTA 128x256x2048 = 134 MFLOP (same as a 128x128x4096 v4 tile);
// exchange 64 KB out + 64 KB in per CTA (~0.5 us at a few hundred GB/s of SM-to-SM bandwidth), the
// 32 KB bf16 store as v4. Prediction: main loop at the 128x256 rate (~775-800 TFLOP/s on down, where
// v4's fixed costs are amortized) + ~1 us fill + ~1 us exchange + ~1 us store on ~22 us: ~650-690
// TFLOP/s (v4 583), if 64 clusters of 2 are co-resident (gemm_wgmma_cluster_max_active(); fewer
// means a second round and about half that rate). qkv M = 512 is 96 such pairs = 192 CTAs: 1.45
// rounds, not its kernel.
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/epilogue_add.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace kiln::cuda {
namespace {

// X_ / kX: this kernel's constants (the partial-sum eXchange kernel), apart from v4's WG_ / kernels'.
constexpr int X_BM = 128, X_BN = 256, X_BK = 64, X_THREADS = 384, X_STAGES = 4;
constexpr int kXABytes = X_BM * X_BK * 2;  // (128, 64) bf16 = 16 KB
constexpr int kXBBytes = X_BN * X_BK * 2;  // (256, 64) bf16 = 32 KB
constexpr int kXStageBytes = kXABytes + kXBBytes;
constexpr int kXSmemBytes = X_STAGES * kXStageBytes + 2 * X_STAGES * 8 + 1024;  // + barriers, slack
// The partial a CTA receives: (128 rows, 128 columns) fp32, in the ring once the main loops are done.
constexpr int kXchgBytes = X_BM * (X_BN / 2) * 4;
static_assert(kXchgBytes <= X_STAGES * kXStageBytes, "the exchange buffer fits in the ring");

#ifdef KILN_WGMMA_DEVICE
using namespace wgmma_ptx;

// Sends the accumulators of column half H (d[64 H .. 64 H + 64): j = 16 H .. 16 H + 15) to the peer's
// buffer at peer_buf (a shared::cluster address), as float4 q of thread t at (q x 256 + t) x 16.
template <int H>
__device__ __forceinline__ void send_half(const float* acc, uint32_t peer_buf, int t) {
#pragma unroll
  for (int q = 0; q < 16; ++q) {
    const float* v = acc + 64 * H + 4 * q;
    st_cluster_v4(peer_buf + uint32_t(q * 256 + t) * 16, v[0], v[1], v[2], v[3]);
  }
}

// Adds the peer's partial of column half H (this CTA's own half) from this CTA's buffer.
template <int H>
__device__ __forceinline__ void add_half(float* acc, uint32_t buf, int t) {
#pragma unroll
  for (int q = 0; q < 16; ++q) {
    float a, b, c, d;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(a), "=f"(b), "=f"(c), "=f"(d)
                 : "r"(buf + uint32_t(q * 256 + t) * 16)
                 : "memory");
    float* v = acc + 64 * H + 4 * q;
    v[0] += a;
    v[1] += b;
    v[2] += c;
    v[3] += d;
  }
}
#endif  // KILN_WGMMA_DEVICE

__global__ void __launch_bounds__(X_THREADS, 1)
    gemm_wgmma_cluster_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                              const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode, int64_t M,
                              int64_t N, int64_t K) {
#ifdef KILN_WGMMA_DEVICE
  constexpr int ACC = X_BN / 2;  // (64, 256) per consumer warpgroup: 128 floats per thread
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sa0 = smem_u32(smem);                  // X_STAGES x A (128, 64); later the exchange buffer
  const uint32_t sb0 = sa0 + X_STAGES * kXABytes;       // X_STAGES x B (256, 64)
  const uint32_t full0 = sb0 + X_STAGES * kXBBytes;     // X_STAGES x mbarrier
  const uint32_t empty0 = full0 + X_STAGES * 8;         // X_STAGES x mbarrier
  const uint32_t rank = cluster_ctarank();              // 0 / 1: the K half run, the column half stored
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int64_t m0 = int64_t(blockIdx.x / 2) * X_BM, n0 = int64_t(blockIdx.y) * X_BN;
  const int k_steps = int((K + X_BK - 1) / X_BK), half = (k_steps + 1) / 2;
  const int kt0 = rank ? half : 0;
  const int n_steps = rank ? k_steps - half : half;  // >= 0; the ring counts from 0 in both CTAs

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < X_STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);   // the producer's arrive.expect_tx (+ the TMA transaction bytes)
      mbar_init(empty0 + 8 * s, 2);  // one arrival per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer: v4's, over this CTA's K half
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
      for (int kt = 0; kt < n_steps; ++kt) {
        const int s = kt % X_STAGES;
        const uint32_t use = uint32_t(kt / X_STAGES);
        const int k = (kt0 + kt) * X_BK;
        mbar_wait(empty0 + 8 * s, (use & 1) ^ 1);  // consumers released this stage's previous use
        mbar_arrive_expect_tx(full0 + 8 * s, kXStageBytes);
        tma_load_2d(sa0 + s * kXABytes, &map_x, full0 + 8 * s, k, int(m0));  // (128, 64)
        tma_load_2d(sb0 + s * kXBBytes, &map_w, full0 + 8 * s, k, int(n0));  // (256, 64)
      }
    }
    __syncwarp();
    // The producer's threads take part in both cluster barriers (every thread of the cluster must).
    cluster_sync();  // 1: both rings free
    cluster_sync();  // 2: the partials exchanged
  } else {  // consumer c: tile rows [64c, 64c + 64), all 256 columns
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1, t = c * 128 + tid;
    float acc[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;

    for (int kt = 0; kt < n_steps; ++kt) {
      const int s = kt % X_STAGES;
      mbar_wait(full0 + 8 * s, uint32_t(kt / X_STAGES) & 1);  // stage s holds K step kt
      const uint64_t da = sw128_desc(sa0 + s * kXABytes + c * 64 * 128);  // A rows (64, 64)
      const uint64_t db = sw128_desc(sb0 + s * kXBBytes);                 // B (256, 64)
      fence_acc<ACC>(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < X_BK / 16; ++k) wgmma_bn<X_BN>(acc, da + 2 * k, db + 2 * k);
      wgmma_commit();
      wgmma_wait<1>();  // K step kt-1's wgmmas have retired: its stage may be refilled
      fence_acc<ACC>(acc);
      if (kt > 0 && tid == 0) mbar_arrive(empty0 + 8 * ((kt - 1) % X_STAGES));
    }
    wgmma_wait<0>();  // every wgmma of this warpgroup has read its operands
    fence_acc<ACC>(acc);
    // The ring was written by TMA and read by wgmma (the async proxy); the peer now writes it with
    // generic stores: order this CTA's async-proxy use before the barrier that lets it.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    cluster_sync();  // 1: both CTAs' main loops are done, both rings free
    const uint32_t peer_buf = mapa_shared(sa0, rank ^ 1u);
    if (rank == 0)
      send_half<1>(acc, peer_buf, t);
    else
      send_half<0>(acc, peer_buf, t);
    cluster_sync();  // 2: the peer's partial of this CTA's half is in sa0 .. sa0 + 64 KB
    // Constant register offsets in both branches (a runtime offset would put acc in local memory).
    if (rank == 0) {
      add_half<0>(acc, sa0, t);
      store_acc_block_batched<X_BN / 2>(acc, tid, m0 + c * 64, n0, bias, y, mode, M, N);
    } else {
      add_half<1>(acc, sa0, t);
      store_acc_block_batched<X_BN / 2>(acc + ACC / 2, tid, m0 + c * 64, n0 + X_BN / 2, bias, y, mode, M, N);
    }
  }
#else
  __trap();  // not built for sm_90a: the host never launches this (gemm_wgmma_cluster returns false)
#endif
}

// The kernel's launch configuration in clusters of 2 CTAs along x.
struct PairLaunch : wgmma_ptx::PairClusterLaunch {
  PairLaunch(dim3 grid, cudaStream_t stream) : PairClusterLaunch(grid, X_THREADS, kXSmemBytes, stream) {}
};

// Clusters of 2 of this kernel that can be resident at once on the current device (0: none),
// cached per process for the device last asked. Needs the dynamic shared-memory limit raised first
// (configure(); like device_sms(), done once per process: a lab version, run on one GPU).
int max_active_clusters() {
  static std::atomic<int> cached_dev{-1}, cached{0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (cached_dev.load() == dev) return cached.load();
  const PairLaunch launch(dim3(2, 1, 1), nullptr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, gemm_wgmma_cluster_kernel, &launch.cfg) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so the next launch check does not see it
    n = 0;
  }
  cached.store(n);
  cached_dev.store(dev);
  return n;
}

bool configure() {
  static const bool ok = [] {
    if (cudaFuncSetAttribute(gemm_wgmma_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kXSmemBytes) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return true;
  }();
  return ok;
}

int device_sms() {
  static wgmma_ptx::HopperProbe probe;
  return probe.sms(kXSmemBytes, {reinterpret_cast<const void*>(gemm_wgmma_cluster_kernel)});
}

}  // namespace

int gemm_wgmma_cluster_max_active() {
  if (device_sms() <= 0 || !configure()) return 0;
  return max_active_clusters();
}

bool gemm_wgmma_cluster(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                        int64_t K, cudaStream_t stream) {
  if (!wgmma_shape_ok(x, w, M, N, K)) return false;
  mode = wgmma_epilogue_mode(mode);
  const int64_t m_tiles = (M + X_BM - 1) / X_BM, n_tiles = (N + X_BN - 1) / X_BN;
  if (2 * m_tiles >= (int64_t(1) << 31) || n_tiles >= 65536) return false;
  if (device_sms() <= 0 || !configure() || max_active_clusters() <= 0) return false;
  CUtensorMap mx, mw;
  if (!wgmma_make_map(&mx, x, M, K, X_BM) || !wgmma_make_map(&mw, w, N, K, X_BN)) return false;
  // x: (m tile, rank) pairs, M fastest.
  const PairLaunch launch(dim3(unsigned(2 * m_tiles), unsigned(n_tiles), 1), stream);
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&launch.cfg, gemm_wgmma_cluster_kernel, mx, mw, bias, y, mode, M, N, K));
  return true;
}

}  // namespace kiln::cuda
