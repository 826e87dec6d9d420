// Prefill GEMM on tensor cores: y(M, N) = x(M, K) . W(N, K)^T, both operands K-major.
//
// Block tile 128 (M) x 128 (N) x 32 (K), 8 warps as 2 (M) x 4 (N), warp tile 64 x 32, built from
// mma.sync m16n8k16 (bf16 in, fp32 accumulate): per k16 step a warp issues 4 x 4 MMAs fed by
// 4 ldmatrix.x4 for A and 2 for B. Tiles stream global -> shared with cp.async in a 4-stage ring
// (64 KB), so three tiles are in flight while the fourth is multiplied. Shared rows are 64 bytes
// (4 chunks of 16 B); chunk c of row r is stored at c ^ ((r >> 1) & 3), which makes both the
// cp.async stores and the 8-row ldmatrix reads bank-conflict free.
// Bounds: rows past M or N and K chunks past K are zero-filled by cp.async (src-size 0), and the
// epilogue masks stores. Needs K % 8 == 0 (16-byte chunks); otherwise a scalar fallback runs.
// Plain mma.sync runs on sm_80 and sm_90; a wgmma (sm_90a) version is the next step.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/matmul.h"

namespace kiln::cuda {
namespace {

constexpr int BM = 128, BN = 128, BK = 32, STAGES = 4, THREADS = 256;
constexpr int WM = 64, WN = 32;                         // warp tile
constexpr int MI = WM / 16, NI = WN / 8;                // MMAs per warp tile: 4 x 4
constexpr int kStageElems = (BM + BN) * BK;             // bf16 per stage: A (BM, BK) then B (BN, BK)
constexpr int kSmemBytes = STAGES * kStageElems * 2;    // 64 KB

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

// Copies K-tile kt of A (BM, BK) and B (BN, BK) into one stage: 1024 chunks of 16 B, 4 a thread.
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

__global__ void __launch_bounds__(THREADS, 1)
    gemm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ bias,
                void* __restrict__ y, OutMode mode, int64_t M, int64_t N, int64_t K) {
  extern __shared__ __align__(128) bf16 smem[];  // STAGES x [A (BM, BK) | B (BN, BK)], swizzled
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);  // warp's tile: rows wm*64, cols wn*32
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  const int64_t k_tiles = (K + BK - 1) / BK;

  float acc[MI][NI][4];  // (64, 32) warp tile as 4 x 4 mma accumulators
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(smem + s * kStageElems, x, w, m0, n0, M, N, K, s);
    cp_async_commit();
  }

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();  // tile kt has landed (for this thread) ...
    __syncthreads();              // ... for all threads; and stage (kt-1) % STAGES is free again
    int64_t next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(smem + (next % STAGES) * kStageElems, x, w, m0, n0, M, N, K, next);
    cp_async_commit();

    const bf16* sa = smem + (kt % STAGES) * kStageElems;  // (BM, BK)
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
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int j = 0; j < NI; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int64_t r = m0 + wm * WM + i * 16 + g + (e >= 2 ? 8 : 0);
        int64_t c = n0 + wn * WN + j * 8 + 2 * t + (e & 1);
        if (r < M && c < N) store_out(y, mode, r * N + c, acc[i][j][e] + (bias ? __bfloat162float(bias[c]) : 0.0f));
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

}  // namespace

void gemm(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
          cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  if (K % 8 != 0) {
    int64_t total = M * N;
    gemm_scalar_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(x, w, bias, y, mode, M, N, K);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  static bool configured = false;  // raising the dynamic shared-memory limit once is enough
  if (!configured) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    configured = true;
  }
  KILN_CUDA_REQUIRE((M + BM - 1) / BM < 65536, "gemm: M is too large");
  dim3 grid(unsigned((N + BN - 1) / BN), unsigned((M + BM - 1) / BM));
  gemm_kernel<<<grid, THREADS, kSmemBytes, stream>>>(x, w, bias, y, mode, M, N, K);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
