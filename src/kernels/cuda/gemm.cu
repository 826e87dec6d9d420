// Prefill GEMM on tensor cores: y(M, N) = x(M, K) . W(N, K)^T, both operands K-major.
//
// One templated mma.sync kernel, block tile BM x BN x 32 (K), 8 warps as 2 (M) x 4 (N), each warp
// a WM x WN tile of m16n8k16 MMAs (bf16 in, fp32 accumulate) fed by ldmatrix.x4. Tiles stream
// global -> shared with cp.async in a 4-stage ring, so three tiles are in flight while the fourth
// is multiplied. Shared rows are 64 bytes (4 chunks of 16 B); chunk c of row r is stored at
// c ^ ((r >> 1) & 3), which makes both the cp.async stores and the 8-row ldmatrix reads bank-conflict
// free. Bounds: rows past M or N and K chunks past K are zero-filled by cp.async (src-size 0), and the
// epilogue masks stores. Needs K % 8 == 0 (16-byte chunks); otherwise a scalar fallback runs.
// Versions (kernel_lab times each through gemm_version; H200, Llama-3-8B shapes, M = 512..4096):
//   v1: 128x128 tile, warp 64x32, 64 KB smem, 146 registers -> 1 block (8 warps) per SM.
//       Measured ~230 TFLOP/s flat (cuBLAS 680-790).
//   v2: v1 with __launch_bounds__(256, 2): <= 128 registers, 2 blocks per SM (128 KB smem), so one
//       block's barrier / cp.async wait overlaps the other's MMAs; paired (bf16x2 / float2) epilogue
//       stores. Predicted ~290 TFLOP/s (+25%), if ptxas holds 128 registers without spilling.
//   v3: 128x256 tile, warp 64x64 (8 ldmatrix.x4 per 32 MMAs instead of 6 per 16: a third less
//       shared-memory traffic per MMA; B tile reused over 128 rows, A over 256), 96 KB smem,
//       1 block per SM. Predicted ~320 TFLOP/s where the grid fills the SMs (M*N / 32768 >= ~264
//       tiles: M >= 2048 on every shape, and gate_up / lm_head at 512); at M=512 on N=4096 it has
//       only 64 tiles, so the default picks v2 there.
//   Measured (H200, 2026-11-30, same run as cuBLAS): v2 233-346 TFLOP/s (best at M >= 2048: 323-346;
//   gate_up/lm_head 280-309), v3 only 250-265 (one 96 KB block per SM hides no latency: the
//   prediction of 320 assumed the ldmatrix traffic was the limit, it is not), v1 225-259.
//   mma.sync peaks well below Hopper's wgmma rate; the step to cuBLAS (~700) is a wgmma + TMA
//   kernel on sm_90a:
//   v4: gemm_wgmma.cu (warp-specialized wgmma m64n256k16 / m64n128k16 fed by TMA; its header has the
//       design and the prediction). Runs only on cc 9.0 with an sm_90a build, K % 8 == 0 and 16-byte
//       aligned x / W; anywhere else version 4 runs v2. Predicted 550-650 TFLOP/s at M >= 2048 and
//       400-450 at M=512; measured (H200 run 5, same run as cuBLAS): 454-783, i.e. 0.80-1.04x cuBLAS
//       (ahead on down M=512, o M=512, lm_head M=512/2048). The default since run 5.
//   v5: gemm_wgmma_persistent.cu: v4's main loop in a persistent grid (one block per SM, tiles
//       round-robin, the TMA ring running on across tiles), ping-pong 128x128 tiles (the two consumer
//       warpgroups own alternate tiles, so one's epilogue overlaps the other's main loop) or, where
//       128x128 tiles quantize badly (qkv M = 512), cooperative 128x192. Its header has the counts
//       and the prediction. v6 / v7 / v8 force its ping-pong 128x128 / cooperative 128x192 /
//       cooperative 128x256 configuration (lab and tests: each timed and checked on its own).
//       v9: v8 with the epilogue through shared memory and TMA stores (bf16 output, N % 8 == 0;
//       else v8): the consumers write the tile to shared memory and go on with the next tile while
//       the TMA unit stores it. Same conditions as v4 (else v2).
//       Measured (H200 device run 2, same run as cuBLAS, TFLOP/s): v5 (auto) 0.90-1.14x cuBLAS on
//       every Llama-3-8B shape at M = 512 / 2048 / 4096 (v4: 0.72-1.00x in the same run); v9 is
//       0.94-1.07x at M >= 2048. The default since then (gemm_default_version).
//   Session 7 candidates for the M = 512 shapes still under 0.90x cuBLAS (lab versions, not in v5's
//   plan): v10 / v11 the persistent kernel's cooperative 128x224 tiles with register / TMA-store
//   epilogue (gate_up: 512 tiles = 3.88 rounds); v12 gemm_wgmma_cluster.cu, 128x256 tiles split
//   over K between the 2 CTAs of a cluster, partials exchanged through distributed shared memory
//   (o: 64 tiles = 128 CTAs, one round, the 128x256 main loop). Where they cannot run, v10 / v11
//   run v2 and v12 runs v4 (else v2). Measured (run 3, TFLOP/s, cuBLAS in brackets): gate_up
//   M=512 v10 665.7, v11 687.3 against v5's 679.1 (761.1); o M=512 v12 525.8 against v4's 588.0
//   (659.5): none adopted.
//   Session 9: v13 / v14 / v15 gemm_wgmma_multicast.cu, v4's cooperative 128x128 / 128x192 / 128x256
//   tile run by 2-CTA clusters of adjacent M tiles that load half of their shared W tile each and
//   multicast it (L2 -> SM bytes per K step -25% / -30% / -33%), for the one-round M = 512 shapes
//   (o, qkv). Where clusters cannot run they run v4 (else v2). Measured (run 3): o 574 vs v4's 585,
//   qkv 630 vs v5's 622 TFLOP/s (cuBLAS 666 / 696): the bytes were not the limit; not adopted.
//   v16 / v17: v5's configs 7 / 8, cooperative 128x128 / 128x192 with the TMA-store epilogue (else
//   v4 / v7): what the register epilogue costs the one-round M = 512 tiles.
//   v18 / v19: v5's configs 9 / 10, cooperative 128x256 / 128x128 adding into the fp32 add_f32
//   target through TMA reduce-adds (else v8 / v4): the residual-add products (o, down). Written
//   without a GPU at the end of session 9; kernel_lab --gemm-add times them. Measured (session 10
//   run 1): o / down M = 512 (v19 vs v4) 30.0 / 84.2 vs 35.2 / 90.7 us, M = 2048 and 4096 (v18 vs
//   v8) 2.3-5.1% faster; v5's plan now takes them for add_f32 (gemm_wgmma_persistent.cu).
// Split-K (gemm_splitk, batched decode 16 < M <= 256; design in matmul.h): the v2 kernel and v4's
// wgmma kernel take a K range per grid z (k_tiles_per_split) and write fp32 partials to slice z of
// a workspace; splitk_reduce_kernel sums the slices in a fixed order and applies the epilogue.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/sampling.h"

namespace kiln::cuda {
namespace {

constexpr int BK = 32, STAGES = 4, THREADS = 256;

// Block tile BM x BN, warp tile WM x WN (8 warps), MINB blocks per SM asked of the compiler.
template <int BM_, int BN_, int WM_, int WN_, int MINB_>
struct Cfg {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, MINB = MINB_;
  static constexpr int MI = WM / 16, NI = WN / 8;               // MMAs per warp tile
  static constexpr int kStageElems = (BM + BN) * BK;            // bf16 per stage: A (BM, BK), B (BN, BK)
  static constexpr int kSmemBytes = STAGES * kStageElems * 2;
  static_assert((BM / WM) * (BN / WN) * 32 == THREADS, "8 warps");
  static_assert((BM + BN) * BK / 8 % THREADS == 0, "whole chunks per thread");
};
using CfgV1 = Cfg<128, 128, 64, 32, 1>;  // 64 KB
using CfgV2 = Cfg<128, 128, 64, 32, 2>;  // 64 KB, 2 per SM
using CfgV3 = Cfg<128, 256, 64, 64, 1>;  // 96 KB

__device__ __forceinline__ int swz(int row, int chunk) { return row * BK + ((chunk ^ ((row >> 1) & 3)) << 3); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  int n = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Copies K-tile kt of A (BM, BK) and B (BN, BK) into one stage: (BM + BN) * 4 chunks of 16 B.
template <int BM, int BN>
__device__ __forceinline__ void load_stage(bf16* stage, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                           int64_t m0, int64_t n0, int64_t M, int64_t N, int64_t K, int64_t kt) {
  const uint32_t base = uint32_t(__cvta_generic_to_shared(stage));
#pragma unroll
  for (int i = 0; i < (BM + BN) * BK / 8 / THREADS; ++i) {
    int idx = threadIdx.x + i * THREADS;
    int row = idx / (BK / 8), chunk = idx % (BK / 8);  // row < BM: A, else B
    bool is_a = row < BM;
    int r = is_a ? row : row - BM;
    int64_t g_row = (is_a ? m0 : n0) + r, k = kt * BK + chunk * 8;
    bool valid = g_row < (is_a ? M : N) && k < K;
    const bf16* src = is_a ? x + (valid ? g_row * K + k : 0) : w + (valid ? g_row * K + k : 0);
    cp_async16(base + uint32_t((is_a ? 0 : BM * BK) + swz(r, chunk)) * 2, src, valid);
  }
}

template <class C>
__global__ void __launch_bounds__(THREADS, C::MINB)
    gemm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ bias,
                void* __restrict__ y, OutMode mode, int64_t M, int64_t N, int64_t K, int64_t k_tiles_per_split,
                int64_t y_split_stride) {
  constexpr int BM = C::BM, BN = C::BN, WM = C::WM, WN = C::WN, MI = C::MI, NI = C::NI;
  constexpr int kStageElems = C::kStageElems;
  extern __shared__ __align__(128) bf16 smem[];  // STAGES x [A (BM, BK) | B (BN, BK)], swizzled
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);  // warp's tile: rows wm*WM, cols wn*WN
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  // Split-K (gemm_splitk): block z covers K tiles [kt0, kt1) and writes its fp32 partial to slice z
  // of the workspace y (mode store_f32, no bias). Unsplit launches: gridDim.z = 1, one slice = all.
  const int64_t kt0 = int64_t(blockIdx.z) * k_tiles_per_split;
  const int64_t kt1 = imin64((K + BK - 1) / BK, kt0 + k_tiles_per_split);
  if (blockIdx.z > 0) y = static_cast<float*>(y) + int64_t(blockIdx.z) * y_split_stride;

  float acc[MI][NI][4];  // (WM, WN) warp tile as MI x NI mma accumulators
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (kt0 + s < kt1) load_stage<BM, BN>(smem + s * kStageElems, x, w, m0, n0, M, N, K, kt0 + s);
    cp_async_commit();
  }

  for (int64_t kt = kt0; kt < kt1; ++kt) {  // ring slot of tile kt: (kt - kt0) % STAGES
    cp_async_wait<STAGES - 2>();  // tile kt has landed (for this thread) ...
    __syncthreads();              // ... for all threads; and the slot of tile kt-1 is free again
    int64_t next = kt + STAGES - 1;
    if (next < kt1)
      load_stage<BM, BN>(smem + ((next - kt0) % STAGES) * kStageElems, x, w, m0, n0, M, N, K, next);
    cp_async_commit();

    const bf16* sa = smem + ((kt - kt0) % STAGES) * kStageElems;  // (BM, BK)
    const bf16* sb = sa + BM * BK;                          // (BN, BK)
    const uint32_t sa_addr = uint32_t(__cvta_generic_to_shared(sa));
    const uint32_t sb_addr = uint32_t(__cvta_generic_to_shared(sb));
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t a[MI][4], b[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {  // A fragment (16, 16): lanes 0-15 rows at k chunk 0, 16-31 at chunk 1
        int row = wm * WM + i * 16 + (lane % 16), chunk = kk * 2 + lane / 16;
        ldmatrix_x4(sa_addr + uint32_t(swz(row, chunk)) * 2, a[i][0], a[i][1], a[i][2], a[i][3]);
      }
#pragma unroll
      for (int j = 0; j < NI; j += 2) {  // B fragments of two n8 tiles (16 W rows, 16 k)
        int row = wn * WN + j * 8 + (lane & 7) + ((lane >> 4) << 3), chunk = kk * 2 + ((lane >> 3) & 1);
        ldmatrix_x4(sb_addr + uint32_t(swz(row, chunk)) * 2, b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) mma_bf16(acc[i][j], a[i], b[j]);
    }
  }
  cp_async_wait<0>();

  // Epilogue: accumulator e of tile (i, j) is row g (+8 for e >= 2), column 2t (+1 for odd e).
  // Columns come in even pairs (c, c + 1): one paired store when both exist and N is even.
  const int g = lane / 4, t = lane % 4;
  const bool pairs = (N & 1) == 0;
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    const int64_t c = n0 + wn * WN + j * 8 + 2 * t;
    if (c >= N) continue;
    const bool has_c1 = c + 1 < N;
    const float b0 = bias ? __bfloat162float(bias[c]) : 0.0f;
    const float b1 = bias && has_c1 ? __bfloat162float(bias[c + 1]) : 0.0f;
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = m0 + wm * WM + i * 16 + g + 8 * h;
        if (r >= M) continue;
        const float v0 = acc[i][j][2 * h] + b0, v1 = acc[i][j][2 * h + 1] + b1;
        if (pairs && has_c1) {
          store_out2(y, mode, r * N + c, v0, v1);
        } else {
          store_out(y, mode, r * N + c, v0);
          if (has_c1) store_out(y, mode, r * N + c + 1, v1);
        }
      }
    }
  }
}

// K % 8 != 0: one thread per output, fp32. Correct, slow; no model has such a K.
__global__ void gemm_scalar_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                   const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode, int64_t M,
                                   int64_t N, int64_t K) {
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= M * N) return;
  int64_t r = idx / N, c = idx % N;
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) acc = fmaf(__bfloat162float(x[r * K + k]), __bfloat162float(w[c * K + k]), acc);
  store_out(y, mode, idx, acc + (bias ? __bfloat162float(bias[c]) : 0.0f));
}


template <class C>
void configure() {
  static bool configured = false;  // raising the dynamic shared-memory limit once is enough
  if (!configured) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    configured = true;
  }
}

template <class C>
void launch(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
            cudaStream_t stream) {
  configure<C>();
  KILN_CUDA_REQUIRE((M + C::BM - 1) / C::BM < 65536, "gemm: M is too large");
  dim3 grid(unsigned((N + C::BN - 1) / C::BN), unsigned((M + C::BM - 1) / C::BM));
  gemm_kernel<C><<<grid, THREADS, C::kSmemBytes, stream>>>(x, w, bias, y, mode, M, N, K, (K + BK - 1) / BK, 0);
}

// ---- split-K for batched decode (kGemvMaxRows < M <= kSplitKMaxRows; design in matmul.h) ----

// Sums the S partial slices (S, M, N) of the workspace in slice order 0, 1, .., S-1 (fixed, so the
// result does not depend on which block finished first), adds the bias and writes y per OutMode.
// VEC: N % 4 == 0 and 16-byte aligned partials / y: 4 columns per thread (float4 loads, paired stores).
template <bool VEC>
__global__ void splitk_reduce_kernel(const float* __restrict__ part, int splits, const bf16* __restrict__ bias,
                                     void* __restrict__ y, OutMode mode, int64_t M, int64_t N) {
  const int64_t MN = M * N;
  const int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * (VEC ? 4 : 1);
  if (i >= MN) return;
  if constexpr (VEC) {
    float4 a = *reinterpret_cast<const float4*>(part + i);
    for (int z = 1; z < splits; ++z) {
      const float4 p = *reinterpret_cast<const float4*>(part + int64_t(z) * MN + i);
      a.x += p.x;
      a.y += p.y;
      a.z += p.z;
      a.w += p.w;
    }
    if (bias) {
      const int64_t c = i % N;  // 4 columns of one row (N % 4 == 0)
      a.x += __bfloat162float(bias[c]);
      a.y += __bfloat162float(bias[c + 1]);
      a.z += __bfloat162float(bias[c + 2]);
      a.w += __bfloat162float(bias[c + 3]);
    }
    store_out2(y, mode, i, a.x, a.y);
    store_out2(y, mode, i + 2, a.z, a.w);
  } else {
    float a = part[i];
    for (int z = 1; z < splits; ++z) a += part[int64_t(z) * MN + i];
    if (bias) a += __bfloat162float(bias[i % N]);
    store_out(y, mode, i, a);
  }
}

void splitk_reduce(const float* part, int splits, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                   cudaStream_t stream) {
  const int64_t MN = M * N;
  const bool vec = N % 4 == 0 && (reinterpret_cast<uintptr_t>(part) | reinterpret_cast<uintptr_t>(y)) % 16 == 0;
  const int64_t threads = vec ? MN / 4 : MN;
  const unsigned blocks = unsigned((threads + 255) / 256);
  if (vec)
    splitk_reduce_kernel<true><<<blocks, 256, 0, stream>>>(part, splits, bias, y, mode, M, N);
  else
    splitk_reduce_kernel<false><<<blocks, 256, 0, stream>>>(part, splits, bias, y, mode, M, N);
  KILN_CUDA_CHECK_LAUNCH();
}

// What the split choice knows of a partial kernel: its output tile, K step, resident blocks per SM.
struct SplitGeom {
  int bm, bn, bk, blocks_per_sm;
};
constexpr SplitGeom kGeomWgmma{128, 128, 64, 1};  // gemm_wgmma.cu WgCfg128: 192 KB smem, 1 block per SM
constexpr SplitGeom kGeomMma{CfgV2::BM, CfgV2::BN, BK, CfgV2::MINB};  // v2: 64 KB smem, 2 per SM

// Time model of a split (seconds; only the ranking matters). The weight-streaming blocks are
// latency-bound, not bandwidth-bound, in this regime: the H200 profile (M = 64) shows ~22-42 GB/s per
// resident block whatever the block count (o: 32 blocks -> 0.89 TB/s), so a block's time is its
// weight bytes at kBlockRate plus a fixed pipeline fill / epilogue cost, and blocks beyond one wave of
// resident blocks run in further waves. The reduce kernel reads S partial slices and writes M x N
// (mostly L2-resident) plus a launch.
double split_time(const SplitGeom& g, int64_t M, int64_t N, int64_t K, int sms, int S) {
  constexpr double kBlockRate = 3.8e12 / 132, kBlockFixed = 1.5e-6, kReduceRate = 3.0e12, kReduceFixed = 2e-6;
  const int64_t steps = (K + g.bk - 1) / g.bk, per = (steps + S - 1) / S, used = (steps + per - 1) / per;
  const int64_t tiles = ((M + g.bm - 1) / g.bm) * ((N + g.bn - 1) / g.bn);
  const int64_t slots = int64_t(std::max(sms, 1)) * g.blocks_per_sm;
  const int64_t waves = (tiles * used + slots - 1) / slots;
  const double rate = kBlockRate * 132.0 / double(slots);  // per resident block (132 SMs x 1 block: 28.8 GB/s)
  double t = double(waves) * (double(per) * g.bn * g.bk * 2 / rate + kBlockFixed);
  if (used > 1) t += double(used + 1) * double(M * N) * 4 / kReduceRate + kReduceFixed;
  return t;
}

// Auto split count: the fastest S by split_time, S = 1 unless a split is predicted >= 15% faster
// (S = 1 runs the unsplit default GEMM, which has no reduce). Slices keep >= 4 K steps.
int choose_splits(const SplitGeom& g, int64_t M, int64_t N, int64_t K, int sms, int max_splits) {
  const int64_t steps = (K + g.bk - 1) / g.bk;
  const int64_t limit = std::min<int64_t>(max_splits, steps / 4);
  const double t1 = split_time(g, M, N, K, sms, 1);
  int best = 1;
  double best_t = t1;
  for (int S = 2; S <= limit; ++S) {
    const double t = split_time(g, M, N, K, sms, S);
    if (t < best_t) {
      best_t = t;
      best = S;
    }
  }
  return best_t <= 0.85 * t1 ? best : 1;
}


// KILN_GEMM_SPLITK, read once: unset / empty / "auto" (any non-number) -> -1 (auto), "0" -> 0
// (matmul never splits: the pre-split-K path), n >= 1 -> n (matmul forces n slices for
// kGemvMaxRows < M <= kSplitKMaxRows).
int splitk_env() {
  static const int v = [] {
    const int n = env_int("KILN_GEMM_SPLITK", -1);
    return n >= 0 ? std::min(n, kSplitKMaxSplits) : -1;
  }();
  return v;
}

}  // namespace

int gemm_splitk_plan(int version, int splits, int64_t M, int64_t N, int64_t K, int64_t workspace_floats) {
  if (M <= 0 || N <= 0 || K <= 0 || K % 8 != 0) return 1;
  const bool wg = version != 2 && gemm_wgmma_available();
  const SplitGeom& g = wg ? kGeomWgmma : kGeomMma;
  const int sms = wg ? gemm_wgmma_sms() : device_sm_count();
  const int64_t fit = workspace_floats / (M * N);  // slices the workspace holds
  int S = splits > 0 ? splits : choose_splits(g, M, N, K, sms, kSplitKMaxSplits);
  S = int(std::min<int64_t>(S, fit));
  if (S <= 1) return 1;
  const int64_t steps = (K + g.bk - 1) / g.bk, per = (steps + S - 1) / S;
  return int((steps + per - 1) / per);  // no empty slice: per * (used - 1) < steps
}

int gemm_splitk(int version, int splits, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode,
                int64_t M, int64_t N, int64_t K, MatmulWorkspace ws, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(version == 0 || version == 2 || version == 4, "gemm_splitk: version must be 0, 2 or 4");
  if (M == 0 || N == 0) return 1;
  const int S = ws.data ? gemm_splitk_plan(version, splits, M, N, K, ws.floats) : 1;
  if (S > 1) {
    bool launched = false;
    if (version != 2 && gemm_wgmma_available()) {
      const int64_t steps = (K + kGeomWgmma.bk - 1) / kGeomWgmma.bk, per = (steps + S - 1) / S;
      launched = gemm_wgmma_splitk(x, w, ws.data, M, N, K, S, int(per), stream);
      if (launched) {
        splitk_reduce(ws.data, S, bias, y, mode, M, N, stream);
        return S;
      }
    }
    // The mma.sync v2 kernel over K ranges (sm_80, or wgmma unable: e.g. unaligned x / W). The
    // plan above was made for the wgmma geometry when wgmma is available: redo it for v2.
    const int S2 = gemm_splitk_plan(2, splits > 0 ? splits : S, M, N, K, ws.floats);
    if (S2 > 1 && (M + CfgV2::BM - 1) / CfgV2::BM < 65536) {
      const int64_t steps = (K + BK - 1) / BK, per = (steps + S2 - 1) / S2;
      configure<CfgV2>();
      dim3 grid(unsigned((N + CfgV2::BN - 1) / CfgV2::BN), unsigned((M + CfgV2::BM - 1) / CfgV2::BM), unsigned(S2));
      gemm_kernel<CfgV2><<<grid, THREADS, CfgV2::kSmemBytes, stream>>>(x, w, nullptr, ws.data, OutMode::store_f32,
                                                                       M, N, K, per, M * N);
      KILN_CUDA_CHECK_LAUNCH();
      splitk_reduce(ws.data, S2, bias, y, mode, M, N, stream);
      return S2;
    }
  }
  gemm_version(version, x, w, bias, y, mode, M, N, K, stream);
  return 1;
}

bool matmul_splitk(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                   int64_t K, MatmulWorkspace ws, cudaStream_t stream) {
  const int env = splitk_env();
  if (env == 0 || !ws.data || M <= kGemvMaxRows || M > kSplitKMaxRows) return false;
  gemm_splitk(0, env > 0 ? env : 0, x, w, bias, y, mode, M, N, K, ws, stream);
  return true;
}

// Default: v5 (gemm_wgmma_persistent.cu: per shape v4 where 128x128 tiles fit in one round, else
// the persistent kernel's ping-pong 128x128 / cooperative 128x192 / 128x256 with TMA-store epilogue;
// measured 0.90-1.14x cuBLAS on the H200, v4 0.72-1.00x in the same run) where it can run, which
// gemm_version checks per call (Hopper, 16-byte aligned operands, K % 8 == 0) before falling back to
// v2, the fastest mma.sync version (the path on sm_80). KILN_GEMM_VERSION
// overrides the default for experiments (kiln bench end to end with another version), read once.
static int gemm_default_version() {
  static const int v = [] {
    const int parsed = env_int("KILN_GEMM_VERSION", 0);
    return parsed >= 1 && parsed <= gemm_versions() ? parsed : 5;
  }();
  return v;
}

int gemm_versions() { return 19; }

void gemm_version(int version, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(version >= 0 && version <= gemm_versions(), "gemm: no such version");
  if (M == 0 || N == 0) return;
  if (K % 8 != 0) {
    int64_t total = M * N;
    gemm_scalar_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(x, w, bias, y, mode, M, N, K);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  if (version == 0) version = gemm_default_version();
  if (version == 4) {
    if (gemm_wgmma(x, w, bias, y, mode, M, N, K, stream)) return;
    version = 2;  // not sm_90a-capable here, or K / alignment it cannot take
  } else if (version == 12) {  // split-K over a 2-CTA cluster; else v4, else v2
    if (gemm_wgmma_cluster(x, w, bias, y, mode, M, N, K, stream)) return;
    if (gemm_wgmma(x, w, bias, y, mode, M, N, K, stream)) return;
    version = 2;
  } else if (version >= 16) {  // v16-v19: persistent configs 7-10 (TMA-store / TMA reduce-add epilogues)
    if (gemm_wgmma_persistent(version - 9, x, w, bias, y, mode, M, N, K, stream)) return;
    version = 2;
  } else if (version >= 13) {  // 2-CTA clusters multicasting W: 128x128 / 128x192 / 128x256; else v4, else v2
    if (gemm_wgmma_multicast(version == 13 ? 128 : version == 14 ? 192 : 256, x, w, bias, y, mode, M, N, K, stream))
      return;
    if (gemm_wgmma(x, w, bias, y, mode, M, N, K, stream)) return;
    version = 2;
  } else if (version >= 5) {  // v5 auto, v6 / v7 / v8 / v9 / v10 / v11 its configs 1 .. 6
    if (gemm_wgmma_persistent(version - 5, x, w, bias, y, mode, M, N, K, stream)) return;
    version = 2;
  }
  if (version == 1)
    launch<CfgV1>(x, w, bias, y, mode, M, N, K, stream);
  else if (version == 2)
    launch<CfgV2>(x, w, bias, y, mode, M, N, K, stream);
  else
    launch<CfgV3>(x, w, bias, y, mode, M, N, K, stream);
  KILN_CUDA_CHECK_LAUNCH();
}

bool gemm_swiglu_ok(const bf16* x, const bf16* w_gu, const bf16* h, int64_t M, int64_t inter, int64_t K) {
  static const bool on = env_switch_on("KILN_GEMM_SWIGLU");
  if (!on || M <= kGemvMaxRows || gemm_default_version() != 5) return false;  // KILN_GEMM_VERSION: the unfused GEMM
  // Batched decode rows: only where matmul's split-K step would not split the (M, 2I) product (a
  // forced KILN_GEMM_SPLITK=n, or the auto plan with the backend's workspace), so the bits match.
  if (M <= kSplitKMaxRows) {
    const int env = splitk_env();
    const int S = env == 0 ? 1 : env > 0 ? env : gemm_splitk_plan(0, 0, M, 2 * inter, K, kSplitKWorkspaceFloats);
    if (S > 1) return false;
  }
  return gemm_wgmma_swiglu_can_run(x, w_gu, h, M, inter, K);
}

bool gemm_swiglu(const bf16* x, const bf16* w_gu, bf16* h, int64_t M, int64_t inter, int64_t K, cudaStream_t stream) {
  return gemm_swiglu_ok(x, w_gu, h, M, inter, K) && gemm_wgmma_swiglu(x, w_gu, h, M, inter, K, stream);
}

bool gemm_argmax_ok(const bf16* x, const bf16* w, int64_t M, int64_t N, int64_t K) {
  static const bool on = env_switch_on("KILN_HEAD_ARGMAX");
  if (!on || M <= kSplitKMaxRows || gemm_default_version() != 5) return false;
  return gemm_wgmma_argmax_can_run(x, w, M, N, K);
}

bool gemm_argmax(const bf16* x, const bf16* w, float2* parts, int32_t* ids, int64_t M, int64_t N, int64_t K,
                 cudaStream_t stream) {
  if (!gemm_argmax_ok(x, w, M, N, K) || !gemm_wgmma_argmax(x, w, parts, M, N, K, stream)) return false;
  argmax_parts(parts, M, int((N + kGemmArgmaxTileCols - 1) / kGemmArgmaxTileCols), ids, stream);
  return true;
}

namespace {
bool& gemm_rope_switch() {
  static bool on = env_switch_on("KILN_GEMM_ROPE");
  return on;
}
}  // namespace

void set_gemm_rope_kv_enabled(bool on) { gemm_rope_switch() = on; }

bool gemm_rope_kv_ok(const bf16* x, const bf16* w, int64_t M, int64_t K, const RopeKvTarget& t) {
  if (!gemm_rope_switch() || M <= kSplitKMaxRows || gemm_default_version() != 5) return false;
  return gemm_wgmma_rope_can_run(x, w, M, K, t);
}

bool gemm_rope_kv(const bf16* x, const bf16* w, const bf16* bias, const RopeKvTarget& t, int64_t M, int64_t K,
                  cudaStream_t stream) {
  if (!gemm_rope_kv_ok(x, w, M, K, t)) return false;
  gemm_wgmma_rope(x, w, bias, t, M, K, stream);
  return true;
}

void gemm(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
          cudaStream_t stream) {
  gemm_version(0, x, w, bias, y, mode, M, N, K, stream);
}

}  // namespace kiln::cuda
