// Prefill GEMM on Hopper (sm_90a), gemm.cu's versions 13 / 14 / 15: v4's cooperative wgmma + TMA
// tile (gemm_wgmma.cu; its header has the shared layout, descriptors and accumulator layout) run by
// 2-CTA thread-block clusters whose two CTAs share their W tile through TMA multicast. Same
// contract: y(M, N) = x(M, K) . W(N, K)^T (+ bias) per OutMode, bf16 K-major operands, fp32
// accumulation, any M and N; K % 8 == 0 and 16-byte aligned x and W (wgmma_shape_ok).
//
// Why: the one-round M = 512 shapes that stay under issue #6's 0.90x cuBLAS (qkv 0.89 with
// cooperative 128x192 tiles, o 0.88 with v4's 128x128: docs/performance/gemm.md, sessions 7-8).
// Both already run one round of 128 tiles on 132 SMs, so tile counts are not what is left; the
// main loop's rate is. Counting what an SM takes from L2 per 64-wide K step: A (128, 64) = 16 KB
// and B (BN, 64) = BN x 128 bytes: 32 KB per 2.1 MFLOP at BN = 128, 40 KB per 3.1 MFLOP at 192.
// At cuBLAS's o rate (660 TFLOP/s) that is 128 CTAs x 64 steps x 32 KB = 268 MB in 26 us: ~10 TB/s
// from L2 to the SMs, in the range where Hopper's L2 stops keeping up. The two M tiles of a
// cluster (rows m0 and m0 + 128) read the same W tile; here each CTA loads half of it and the TMA
// unit writes that half into both CTAs' shared memory: per CTA and step 16 KB of A + BN x 64 bytes
// of B (24 KB at BN = 128: -25%; 28 KB at 192: -30%). cuBLAS's Hopper kernels run 2-CTA clusters
// the same way (cluster shape 2x1 is CUTLASS's default for sm90 GEMMs).
//
// Design: grid (2 x ceil(m_tiles / 2), n_tiles), cluster (2, 1, 1): the pair is (m tile 2i, 2i + 1)
// on one n tile (an odd last m tile's partner lies wholly past M: TMA zero-fills its A, the
// epilogue stores nothing, it still loads its half of B for the other). 384 threads as v4: one
// TMA producer warpgroup (40 registers), two wgmma consumers (232), BN in {128, 192, 256} with a
// 6 / 5 / 4-stage ring (192 / 200 / 192 KB).
//   Ring, per CTA: full[s] (count 1: the own producer's arrive.expect_tx of the whole stage, A + both
//   B halves: the peer's multicast half completes its bytes here too) and empty[s] (count 4: both
//   consumer warpgroups of both CTAs, since the peer's producer writes into this CTA's stage s).
//   A consumer releases stage s by arriving on empty[s] of both CTAs (mapa + mbarrier.arrive at
//   cluster scope). A producer refills stage s only after all four released it: neither CTA's
//   multicast can overwrite a stage the other still reads, and a multicast for use u + 1 reaches a
//   full[s] whose use u completed (its own consumers waited on it before releasing). A peer's bytes
//   may land before this CTA's producer arrives with expect_tx for the phase: the phase needs that
//   arrival to complete, and tx-count may go below zero meanwhile.
//   Start: cluster_sync after the barriers are initialized (no multicast or remote arrive may reach
//   an uninitialized barrier). End: every thread arrives on the cluster barrier once its last remote
//   access is done (consumers: after the main loop, before the epilogue; producer: after its last
//   load) and waits on it before exiting, so neither CTA's shared memory goes away while the other
//   may still arrive on its barriers.
// Prediction (H200): if L2 -> SM bytes bound the one-round M = 512 tiles, o (BN = 128) and qkv
// (BN = 192) gain up to the 25-30% cut in bytes, i.e. at cuBLAS's rate or past it; if they do not
// (the tensor cores' issue or the ring fill bound it), about v4 / v7's rate minus ~1 us of
// cluster barriers. Written without a GPU (session 9).
// Measured (session 9 run 3, same run as cuBLAS, TFLOP/s, M = 512): o v13 574.2 vs v4 584.8 (cuBLAS
// 666.1); qkv v14 629.6 vs v7 611.0 / v5 622.3 (cuBLAS 696.0); gate_up, down, lm_head and every
// M = 2048 shape slower than v5. So L2 -> SM bytes were not what held these tiles back: a lab
// version only. ncu (run 4) showed cuBLAS's kernels for the same two shapes use these very tiles
// (nvjet_sm90_tst_128x128_64x6_2x1 for o, 192x128_64x5_1x2 for qkv: 2-CTA clusters, one round of
// 128 CTAs, 168 registers) and finish in 13% fewer SM-active cycles: what differs is inside the
// CTA, not the tile choice or the L2 traffic (docs/performance/gemm.md, session 9).
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/epilogue_add.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace kiln::cuda {
namespace {

constexpr int MC_BM = 128, MC_BK = 64, MC_THREADS = 384;  // 1 producer + 2 consumer warpgroups

template <int BN_, int STAGES_>
struct McCfg {
  static constexpr int BN = BN_, STAGES = STAGES_;
  static constexpr int kABytes = MC_BM * MC_BK * 2;    // (128, 64) bf16 = 16 KB
  static constexpr int kBBytes = BN * MC_BK * 2;       // (BN, 64): both halves
  static constexpr int kBHalfBytes = kBBytes / 2;      // (BN / 2, 64): what each CTA loads
  static constexpr int kStageBytes = kABytes + kBBytes;  // what lands in each CTA per stage
  static constexpr int kSmemBytes = STAGES * kStageBytes + 2 * STAGES * 8 + 1024;
  static_assert(BN == 128 || BN == 192 || BN == 256, "wgmma n128 / n192 / n256");
  static_assert(kBHalfBytes % 1024 == 0, "each B half starts on a 1024-byte swizzle atom");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of an H100 / H200 block");
};
using McCfg128 = McCfg<128, 6>;  // 192 KB
using McCfg192 = McCfg<192, 5>;  // 200 KB
using McCfg256 = McCfg<256, 4>;  // 192 KB

#ifdef KILN_WGMMA_DEVICE
using namespace wgmma_ptx;
#endif

template <class C>
__global__ void __launch_bounds__(MC_THREADS, 1)
    gemm_wgmma_mc_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                         const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode, int64_t M, int64_t N,
                         int64_t K) {
#ifdef KILN_WGMMA_DEVICE
  constexpr int BN = C::BN, STAGES = C::STAGES, ACC = BN / 2;
  extern __shared__ uint8_t smem_raw[];
  // The aligned offset is the same in both CTAs (same kernel, same static layout): the multicast
  // writes each B half at the issuing CTA's offsets in both.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sa0 = smem_u32(smem);               // STAGES x A (128, 64)
  const uint32_t sb0 = sa0 + STAGES * C::kABytes;    // STAGES x B (BN, 64): rank 0's half, then rank 1's
  const uint32_t full0 = sb0 + STAGES * C::kBBytes;  // STAGES x mbarrier
  const uint32_t empty0 = full0 + STAGES * 8;        // STAGES x mbarrier
  const uint32_t rank = cluster_ctarank();
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int64_t m0 = int64_t(blockIdx.x) * MC_BM, n0 = int64_t(blockIdx.y) * BN;
  const int n_steps = int((K + MC_BK - 1) / MC_BK);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);   // own producer's arrive.expect_tx (+ A and both B halves' bytes)
      mbar_init(empty0 + 8 * s, 4);  // 2 consumer warpgroups x 2 CTAs
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync();  // both CTAs' barriers exist before any multicast byte or remote arrival

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
      const uint32_t b_half = rank * uint32_t(C::kBHalfBytes);
      const int b_row = int(n0) + int(rank) * (BN / 2);
      for (int kt = 0; kt < n_steps; ++kt) {
        const int s = kt % STAGES;
        const uint32_t use = uint32_t(kt / STAGES);
        const int k = kt * MC_BK;
        mbar_wait(empty0 + 8 * s, (use & 1) ^ 1);        // all 4 consumers released the previous use
        mbar_arrive_expect_tx(full0 + 8 * s, C::kStageBytes);
        tma_load_2d(sa0 + s * C::kABytes, &map_x, full0 + 8 * s, k, int(m0));  // own A (128, 64)
        tma_load_2d_multicast(sb0 + s * C::kBBytes + b_half, &map_w, full0 + 8 * s, k, b_row, uint16_t(0x3));
      }
    }
    __syncwarp();
    cluster_arrive();
    cluster_wait();
  } else {  // consumer c: tile rows [64c, 64c + 64), all BN columns
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1;
    // Stage s's empty barrier in CTA 0 and CTA 1 (shared::cluster addresses; one of them is this CTA's).
    const uint32_t empty_r0 = mapa_shared(empty0, 0), empty_r1 = mapa_shared(empty0, 1);
    float acc[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;

    for (int kt = 0; kt < n_steps; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(full0 + 8 * s, uint32_t(kt / STAGES) & 1);  // stage s holds K step kt (A and both halves)
      const uint64_t da = sw128_desc(sa0 + s * C::kABytes + c * 64 * 128);
      const uint64_t db = sw128_desc(sb0 + s * C::kBBytes);
      fence_acc<ACC>(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < MC_BK / 16; ++k) wgmma_bn<BN>(acc, da + 2 * k, db + 2 * k);
      wgmma_commit();
      wgmma_wait<1>();  // K step kt-1's wgmmas have retired: its stage may be refilled, in both CTAs
      fence_acc<ACC>(acc);
      if (kt > 0 && tid == 0) {
        const uint32_t off = 8 * uint32_t((kt - 1) % STAGES);
        mbar_arrive_cluster(empty_r0 + off);
        mbar_arrive_cluster(empty_r1 + off);
      }
    }
    wgmma_wait<0>();
    fence_acc<ACC>(acc);
    cluster_arrive();  // this warpgroup's last remote arrival is done; the epilogue touches only y
    store_acc_block_batched<BN>(acc, tid, m0 + c * 64, n0, bias, y, mode, M, N);
    cluster_wait();
  }
#else
  __trap();  // not built for sm_90a: the host never launches this (gemm_wgmma_multicast returns false)
#endif
}

// Launch configuration in clusters of 2 CTAs along x.
template <class C>
struct McLaunch : wgmma_ptx::PairClusterLaunch {
  McLaunch(dim3 grid, cudaStream_t stream) : PairClusterLaunch(grid, MC_THREADS, C::kSmemBytes, stream) {}
};

// Per instantiation, once per process (a lab / prefill path run on one GPU, as gemm_wgmma_cluster.cu):
// the shared-memory limit raised, then the clusters of 2 that fit at once (0: cannot run).
template <class C>
int max_active_pairs() {
  static const int n = [] {
    if (cudaFuncSetAttribute(gemm_wgmma_mc_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    const McLaunch<C> launch(dim3(2, 1, 1), nullptr);
    int pairs = 0;
    if (cudaOccupancyMaxActiveClusters(&pairs, gemm_wgmma_mc_kernel<C>, &launch.cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      pairs = 0;
    }
    return pairs;
  }();
  return n;
}

bool device_ok() {
  static wgmma_ptx::HopperProbe probe;
  return probe.sms(McCfg192::kSmemBytes, {reinterpret_cast<const void*>(gemm_wgmma_mc_kernel<McCfg128>),
                                           reinterpret_cast<const void*>(gemm_wgmma_mc_kernel<McCfg192>),
                                           reinterpret_cast<const void*>(gemm_wgmma_mc_kernel<McCfg256>)}) > 0;
}

template <class C>
bool launch_mc(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
               cudaStream_t stream) {
  const int64_t m_pairs = (M + 2 * MC_BM - 1) / (2 * MC_BM), n_tiles = (N + C::BN - 1) / C::BN;
  if (2 * m_pairs >= (int64_t(1) << 31) || n_tiles >= 65536) return false;
  if (max_active_pairs<C>() <= 0) return false;
  CUtensorMap mx, mw;
  if (!wgmma_make_map(&mx, x, M, K, MC_BM) || !wgmma_make_map(&mw, w, N, K, C::BN / 2)) return false;
  const McLaunch<C> launch(dim3(unsigned(2 * m_pairs), unsigned(n_tiles), 1), stream);
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&launch.cfg, gemm_wgmma_mc_kernel<C>, mx, mw, bias, y, mode, M, N, K));
  return true;
}

}  // namespace

int gemm_wgmma_multicast_max_active(int bn) {
  if (!device_ok()) return 0;
  return bn == 128 ? max_active_pairs<McCfg128>() : bn == 192 ? max_active_pairs<McCfg192>()
                                                              : bn == 256 ? max_active_pairs<McCfg256>() : 0;
}

bool gemm_wgmma_multicast(int bn, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                          int64_t N, int64_t K, cudaStream_t stream) {
  if (!wgmma_shape_ok(x, w, M, N, K) || !device_ok()) return false;
  mode = wgmma_epilogue_mode(mode);
  if (bn == 128) return launch_mc<McCfg128>(x, w, bias, y, mode, M, N, K, stream);
  if (bn == 192) return launch_mc<McCfg192>(x, w, bias, y, mode, M, N, K, stream);
  if (bn == 256) return launch_mc<McCfg256>(x, w, bias, y, mode, M, N, K, stream);
  return false;
}

}  // namespace kiln::cuda
