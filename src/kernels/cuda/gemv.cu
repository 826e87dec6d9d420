// Decode GEMV: y(M, N) = x(M, K) . W(N, K)^T for M <= 16.
//
// Memory-bound on W (N*K*2 bytes; x and y are tiny). Versions (kernel_lab times each, `gemv_version`):
//   v1: FMA kernel. Each warp owns 2 weight rows, walks K in 16-byte chunks lane-strided (512 B of
//       a row per load instruction), U = 4 (M <= 4) or 2 chunks per row in flight; x via L1; M x 8
//       FMAs per weight chunk, so the time grows with M (H200: gate_up 64.5 us at M=1, 286 at M=16).
//       Kept for K % 8 != 0 (scalar path) and as the lab baseline.
//   v2: tensor-core kernel, every M. A block owns 16 weight rows (one m16 A tile) and splits K over
//       W warps (4, or 8 when the grid is small); partial sums meet in shared memory. A lane (g, t)
//       = (lane/4, lane%4) loads, per chunk group u, 16 bytes of weight rows g and g+8 at chunk
//       4u + t straight into registers: those 8 k values are the A fragments of two m16n8k16 MMAs
//       under a k permutation (physical k 8t + 4s + 2h + l is MMA s's logical k 8h + 2t + l), and
//       the same permutation makes the B fragment of activation row g one 16-byte load of x at the
//       same chunk. So W is read once for all M rows, each element loaded into registers once, and
//       the math is 2 MMAs per weight load per 8 activation rows (two n-tiles for M > 8): the FMA
//       pipe is out of the picture and the time should not grow with M. U = 8 chunk groups per step
//       (16 x 16-byte weight loads in flight per lane, 8 KB per warp; U = 6 for M > 8 to stay
//       without spills), <= 128 registers so 16 warps
//       fit per SM (>= 64 KB of weight loads in flight per SM). Loads carry .L2::256B so the 64-byte
//       row pieces of one instruction become whole-line DRAM fetches. x is read after the PDL wait
//       with a predicated coherent load (session 7: the condition inside the asm instead of a branch
//       around it; same run: tg128 239.3 -> 241.8 tok/s, lm_head 251.7 -> 243.5 us, o in sequence
//       10.43 -> 10.01 us), except on a single wave of 4-warp blocks (qkv), where the branch around
//       the load measured faster (run 4: in sequence 15.26 vs 16.71 us; in the decode step qkv+rope
//       403 vs 461 us; tg128 +0.3%; gemv_mma.cuh, XPRED). Why the branch wins there is not known (no
//       SASS or counters were read).
//   Predicted (H200, copy ceiling 3.9-4.25 TB/s, vs v1): gate_up / down / lm_head at every M within
//   5% of v1's M=1 (64.5 / 40.7 / 247 us; down at 40.7 is 2.9 TB/s so v2 may gain there from the
//   8-warp K split: ~32 us); qkv M=1 21.3 -> ~15 us, o 18.2 -> ~11 us (whole matrix requested in
//   about one round trip: all blocks resident in one wave, <= 3 blocks per SM).
//   Measured v2 (H200, copy 3925 GB/s): gate_up 91-93%, down 81%, lm_head ~107%, but qkv 21.1 us (60%)
//   and o 17.5 us (48%), flat in M: 384 / 256 blocks of 16 rows for 132 SMs. Each warp streams its
//   share in 2 bursts of 16 loads (all warps in lockstep), so DRAM idles between the bursts (load
//   latency + the 32-MMA dependent chain of a step) and at the single wave's tail.
//   v3: v2 with split-K across blocks, for grids of < 4 row blocks per SM. Grid (N/16, S): block (bx, s) covers a K range of whole 1024-element block steps
//       (256 for K < 2048), S from N, K and the SM count only (not M: batch-invariant) to give ~8
//       blocks of 4 warps per SM (o: S = 4, 1024 blocks, one step per warp; qkv: S = 4, 1536;
//       down: S = 7, 1792), so blocks retire and are replaced while others wait on DRAM instead of
//       the whole GPU moving in lockstep bursts. Two accumulator chains per n-tile halve the MMA
//       chain of a step. Partials (fp32, S x M x N) go to a static __device__ workspace (2 MB, no
//       allocation: safe under graph capture); the last block of a row block to arrive (atomic
//       counter, self-resetting) sums the S partials in split order and applies the epilogue, so the
//       result is deterministic and there is no second kernel launch. Not safe for two v3 launches
//       running concurrently on different streams of one device (they share the workspace).
//   Predicted: o 17.5 -> ~11 us (~75% of copy), qkv 21.1 -> ~15 us (~85%), down ~ -10% (81% -> ~88%);
//   cost per block: one fence + atomic (~1 us, overlapped by the 3 other resident blocks) and
//   S x M x N x 8 bytes of partial traffic (M = 16: < 4% of W).
//   Measured (H200 run 4, same run as v2): SLOWER on every shape it targets: qkv 20.0 -> 24.5 us,
//   o 16.5 -> 19.2 us, down 35.5 -> 40.3 us at M=1 (decode step 4.77 -> 5.15 ms). The bursts were not
//   the limit: smaller blocks add a fence + atomic + a serialized last-block reduction per 16 rows
//   and more, shorter load streams. Kept as a lab version (the evidence); the default is v2.
//   v4: v2's kernel with a two-stage register pipeline (gemv_mma.cuh, PIPE): U = 4 chunk groups per
//       stage, the loads of step s + 2 issued right after step s's MMAs, so a warp is never without
//       weight loads in flight until its last step (v2 at U = 8: a 16-load burst, then nothing while
//       it reads x and runs 32 dependent MMAs). x is read with a predicated load (no branch, no
//       load for rows >= M). Aimed at the single-wave shapes (qkv, o: 2-4 steps per warp, so the
//       gap between bursts is a large share of the call) and at the kernel boundaries in sequence.
//   Predicted: qkv / o in sequence 83 / 82% of copy -> ~90%; gate_up / down / lm_head unchanged
//   (many blocks per SM already hide a warp's gaps).
//   Measured (H200, session 7 run 1, same run as v2): SLOWER on every shape, isolated and in
//   sequence: o M=1 in sequence 10.04 (v2) -> 11.33 us, qkv 16.70 -> 17.33, gate_up 57.4 -> 60.6,
//   lm_head 245.4 -> 254.0 isolated; tg128 240.9 -> 231.9 tok/s. The gaps between a warp's bursts
//   were not what kept the bytes off the bus: halving the loads per stage halves what a warp has in
//   flight at its first (largest) request, and with 8-16 warps per SM the others fill the gaps
//   anyway. Kept as a lab version (the evidence); the default is v2.
//   v5: gemv_wgmma.cu (sm_90a): TMA boxes of (128 weight rows, 64 K) into a 4-stage shared ring,
//       wgmma m64nNk16 with W as A and the activation rows as an n8 / n16 B (x read once per 128
//       rows, not once per 16), K split over a thread-block cluster of up to 8 blocks whose partials
//       meet through distributed shared memory. Aimed at the big shapes, where cuBLAS streams W
//       3-6% faster than v2 at M = 1 and 10-15% faster at M = 16.
//   Measured (H200, session 10 runs 1-2, same run as v2): slower at M = 1 on every shape (o 15.2
//       vs 12.5 us, gate_up 61.8 vs 60.0, lm_head 247.5 vs 242.9), ahead by 1-2% only at M = 16 on
//       gate_up (65.2 vs 66.3) and lm_head (257.1 vs 258.3), still 11% / 5% behind cuBLAS there.
//       An 8-stage ring (one block per SM) was slower still. Kept as a lab version (the evidence).
//   v6: gemv_wgmma.cu, v5's tiles in cuBLAS's layout for these shapes (ncu, session 10 call 5:
//       nvjet_sm90_tst_128x8_64x12 etc., one block per SM, an 11-12 stage TMA ring): a persistent
//       grid, a 12-stage ring running on across (row tile, K split) units, splits reduced by the
//       last unit of a tile to arrive (static workspace, counters). Measured (runs 6-7, same run as
//       v2 and cuBLAS): ahead of v2 only on lm_head at M = 16 (253.6-256.5 vs 261.1 us, level with
//       cuBLAS's 253.4-253.7); gate_up M = 1 / 16 60.9 / 68.0 us with one split (v2 60.2 / 66.7,
//       cuBLAS 58.3 / 59.3); the split shapes slower (qkv 26.3 vs 16.9, o 14.9 vs 12.4). cuBLAS's
//       kernel of the same tile, ring and grid streams faster: what it does differently (two
//       consumer warpgroups, a 2x1 cluster) was not isolated. Kept as a lab version.
//       Also measured and removed in session 10: v2 with one cp.async.bulk.prefetch.L2 per weight
//       row at each block's start (the block's whole share requested at once): slower everywhere
//       (lm_head 313.9 vs 242.9 us, qkv 21.5 vs 16.8; tg128 241.9 with it on the single-wave grids
//       and 214.2 on all, against 251.0 without).
//   Two variants measured the same way and removed (code in commit 8ea607b; numbers in
//   docs/performance/gemv.md, session 7): v4 in 80 registers so 24 warps fit per SM (slower still),
//   and v2's loop in a persistent grid of 1 or 2 blocks of 8 warps per SM, each warp requesting the
//   next row block's first step before the epilogue (qkv M=1 in sequence 16.7 -> 15.6 us, every
//   other shape and M = 16 slower: o 10.0 -> 10.9-11.7 us, lm_head M=16 262 -> 357-379 us).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv_reduce.cuh"
#include "kernels/cuda/gemv_wgmma.h"
#include "kernels/cuda/mma_frag.cuh"
#include "kernels/cuda/matmul.h"

namespace kiln::cuda {
namespace {

constexpr int kRowsPerWarp = 2;
constexpr int kWarps = 8;

template <int M>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                           const bf16* __restrict__ bias, void* __restrict__ y,
                                                           OutMode mode, int m_actual, int64_t N, int64_t K) {
  constexpr int U = M <= 4 ? 4 : 2;  // chunks in flight per row; fewer when M makes registers dear
  const int lane = threadIdx.x % 32;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * kRowsPerWarp;
  if (row0 >= N) return;
  const bool has_row1 = row0 + 1 < N;
  const bf16* w0 = w + row0 * K;                   // (K)
  const bf16* w1 = has_row1 ? w0 + K : w0;         // (K); a duplicate of row 0 past the end

  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

  if ((K & 7) == 0) {
    const int64_t n_chunks = K / 8;
    const uint4* w0v = reinterpret_cast<const uint4*>(w0);
    const uint4* w1v = reinterpret_cast<const uint4*>(w1);
    for (int64_t base = lane; base < n_chunks; base += 32 * U) {
      uint4 wa[U], wb[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {  // all W loads first: they are what the kernel waits on
        int64_t c = base + 32 * u;
        if (c < n_chunks) {
          wa[u] = __ldcs(w0v + c);  // streamed once: do not keep in L1/L2 at the expense of x
          wb[u] = __ldcs(w1v + c);
        } else {
          wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int64_t c = base + 32 * u;
        if (c >= n_chunks) break;
        float fa[8], fb[8];
        unpack8(wa[u], fa);
        unpack8(wb[u], fb);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          if (m < m_actual) {
            float fx[8];
            unpack8(__ldg(reinterpret_cast<const uint4*>(x + m * K) + c), fx);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              acc[0][m] = fmaf(fa[i], fx[i], acc[0][m]);
              acc[1][m] = fmaf(fb[i], fx[i], acc[1][m]);
            }
          }
        }
      }
    }
  } else {  // K not a multiple of 8: scalar loads (tests only)
    for (int64_t k = lane; k < K; k += 32) {
      float a = __bfloat162float(w0[k]), b = __bfloat162float(w1[k]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m < m_actual) {
          float xv = __bfloat162float(x[m * K + k]);
          acc[0][m] = fmaf(a, xv, acc[0][m]);
          acc[1][m] = fmaf(b, xv, acc[1][m]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);

  // Lane r*M + m writes (m, row0 + r): spreads the stores over the warp.
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (lane == (r * M + m) % 32 && m < m_actual && (r == 0 || has_row1)) {
        int64_t n = row0 + r;
        float v = acc[r][m] + (bias ? __bfloat162float(bias[n]) : 0.0f);
        store_out(y, mode, int64_t(m) * N + n, v);
      }
    }
  }
}

template <int M>
void launch_v1(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m_actual, int64_t N,
               int64_t K, cudaStream_t stream) {
  int64_t rows_per_block = kWarps * kRowsPerWarp;
  unsigned blocks = unsigned((N + rows_per_block - 1) / rows_per_block);
  gemv_kernel<M><<<blocks, kWarps * 32, 0, stream>>>(x, w, bias, y, mode, m_actual, N, K);
}

void gemv_v1(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m, int64_t N, int64_t K,
             cudaStream_t stream) {
  if (m == 1)
    launch_v1<1>(x, w, bias, y, mode, m, N, K, stream);
  else if (m == 2)
    launch_v1<2>(x, w, bias, y, mode, m, N, K, stream);
  else if (m <= 4)
    launch_v1<4>(x, w, bias, y, mode, m, N, K, stream);
  else if (m <= 8)
    launch_v1<8>(x, w, bias, y, mode, m, N, K, stream);
  else
    launch_v1<16>(x, w, bias, y, mode, m, N, K, stream);
}

// ---- v2: tensor cores (see the top of the file; the kernel is gemv_mma.cuh's, shared with the
// decode GEMVs that fold the norm, RoPE and SwiGLU in: gemv_fused.cu) ----

// loop: plain (v2 and the default) or pipelined (v4).
template <int NT>
void launch_v2(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m, int64_t N, int64_t K,
               cudaStream_t stream, GemvLoop loop) {
  launch_gemv_mma<NT>(x, w, m, N, K, (N + 15) / 16, StoreRows{bias, y, mode}, stream, loop);
}

void gemv_v2(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m, int64_t N, int64_t K,
             cudaStream_t stream, GemvLoop loop) {
  if (K % 8 != 0) return gemv_v1(x, w, bias, y, mode, m, N, K, stream);  // scalar path
  if (m <= 8)
    launch_v2<1>(x, w, bias, y, mode, m, N, K, stream, loop);
  else
    launch_v2<2>(x, w, bias, y, mode, m, N, K, stream, loop);
}

// ---- v3: v2 with split-K across blocks (see the top of the file) ----

// The 16-byte streaming weight load (no L1 allocation, .L2::256B) and the bf16 m16n8k16 MMA.
using qk::ld_weight;
__device__ __forceinline__ void mma_16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
  qk::mma_bf16(c, a0, a1, a2, a3, b0, b1);
}

// Static workspace of v3 (one per device: a __device__ variable lives in every device's copy of the
// module; no allocation, so nothing to do inside a CUDA graph capture): the fp32 partial sums of
// the S splits, (S, m, N) for the launch at hand, and one arrival counter per 16-row block. A
// counter is 0 between launches: the last block of its row block sets it back.
constexpr int kSplitMaxBlocks = 2048;  // S * row blocks of a split launch (H200 default: <= 1584)
__device__ float g_split_part[int64_t(kSplitMaxBlocks) * 16 * kGemvMaxRows];  // 2 MB
__device__ unsigned g_split_count[kSplitMaxBlocks];

// NT, U, W as in v2; C independent MMA accumulator chains per n-tile (the two MMAs of a chunk group
// go to chains s % C; v2's single chain makes the 2U MMAs of a step one dependent sequence of
// ~2U x 30 cycles during which the warp has no load in flight). Block (bx, s) covers chunks
// [s * split_chunks, min((s + 1) * split_chunks, K / 8)) of rows 16 bx .. 16 bx + 15.
template <int NT, int U, int W, int C>
__global__ void __launch_bounds__(W * 32, 16 / W)
    gemv_split_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ bias,
                      void* __restrict__ y, OutMode mode, int m_actual, int64_t N, int64_t K, int64_t split_chunks) {
  __shared__ float red[W][16][8 * NT + 1];
  __shared__ bool is_last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t c_begin = int64_t(blockIdx.y) * split_chunks;
  const int64_t c_end = imin64(c_begin + split_chunks, K / 8);
  const uint4* w_lo = reinterpret_cast<const uint4*>(w + imin64(row0 + g, N - 1) * K);
  const uint4* w_hi = reinterpret_cast<const uint4*>(w + imin64(row0 + g + 8, N - 1) * K);
  const uint4* xr[NT];
  bool x_ok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    x_ok[j] = 8 * j + g < m_actual;
    xr[j] = reinterpret_cast<const uint4*>(x + (x_ok[j] ? (8 * j + g) * K : 0));
  }

  float acc[C][NT][4];
#pragma unroll
  for (int q = 0; q < C; ++q)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[q][j][e] = 0.0f;

  constexpr int kStep = 4 * U;
  for (int64_t step = c_begin + int64_t(warp) * kStep; step < c_end; step += int64_t(W) * kStep) {
    const int64_t base = step + t;
    uint4 a_lo[U], a_hi[U], b[NT][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + 4 * u;
      if (c < c_end) {
        a_lo[u] = ld_weight(w_lo + c);
        a_hi[u] = ld_weight(w_hi + c);
      } else {
        a_lo[u] = a_hi[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = base + 4 * u;
        b[j][u] = (x_ok[j] && c < c_end) ? __ldg(xr[j] + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        mma_16816(acc[0][j], a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y, b[j][u].x, b[j][u].y);
        mma_16816(acc[1 % C][j], a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w, b[j][u].z, b[j][u].w);
      }
  }

#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = acc[0][j][e];
#pragma unroll
      for (int q = 1; q < C; ++q) v += acc[q][j][e];
      red[warp][g + 8 * (e >> 1)][8 * j + 2 * t + (e & 1)] = v;
    }
  __syncthreads();
  const int S = int(gridDim.y);
  if (S == 1) {  // no split: v2's epilogue
    for (int i = threadIdx.x; i < 16 * 8 * NT; i += W * 32) {
      const int r = i % 16, m = i / 16;
      const int64_t n = row0 + r;
      if (m >= m_actual || n >= N) continue;
      float v = bias ? __bfloat162float(bias[n]) : 0.0f;
#pragma unroll
      for (int q = 0; q < W; ++q) v += red[q][r][m];
      store_out(y, mode, int64_t(m) * N + n, v);
    }
    return;
  }
  // Split: this block's partial to the workspace, then the last block of the row block to arrive
  // sums the S partials in split order (so the result does not depend on arrival order: the same
  // bits every run) and applies the epilogue.
  const int64_t plane = int64_t(m_actual) * N;  // floats per split
  for (int i = threadIdx.x; i < 16 * 8 * NT; i += W * 32) {
    const int r = i % 16, m = i / 16;
    const int64_t n = row0 + r;
    if (m >= m_actual || n >= N) continue;
    float v = 0.0f;
#pragma unroll
    for (int q = 0; q < W; ++q) v += red[q][r][m];
    g_split_part[blockIdx.y * plane + int64_t(m) * N + n] = v;
  }
  __threadfence();  // the partials are visible device-wide before the arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&g_split_count[blockIdx.x], 1u) == unsigned(S - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < 16 * 8 * NT; i += W * 32) {
    const int r = i % 16, m = i / 16;
    const int64_t n = row0 + r;
    if (m >= m_actual || n >= N) continue;
    float v = bias ? __bfloat162float(bias[n]) : 0.0f;
    for (int s = 0; s < S; ++s) v += __ldcg(&g_split_part[s * plane + int64_t(m) * N + n]);  // L2: not a stale L1 line
    store_out(y, mode, int64_t(m) * N + n, v);
  }
  if (threadIdx.x == 0) g_split_count[blockIdx.x] = 0;  // ready for the next launch
}

// Splits of K for v3: depends on N, K and the SM count only (never on M, so a row's result is the
// same at every batch size up to v2/v3's n-tile choice). Aim at ~8 blocks of 4 warps per SM (2
// waves of 4 resident blocks: retiring blocks are replaced while others wait on DRAM, instead of
// v2's whole-GPU bursts); splits are whole 1024-element block steps (256 for small K) so the 4
// warps of a block get equal work at U = 8.
int64_t split_chunks_v3(int64_t N, int64_t K) {
  const int64_t row_blocks = (N + 15) / 16, n_chunks = K / 8;
  const int64_t align = n_chunks >= 2 * 128 ? 128 : 32;
  const int64_t target = 8 * int64_t(device_sm_count());
  int64_t s = (target + row_blocks - 1) / row_blocks;
  const int64_t s_max = std::max<int64_t>(1, kSplitMaxBlocks / row_blocks);
  s = std::min(s, s_max);
  int64_t len = std::max(align, n_chunks / s / align * align);
  if ((n_chunks + len - 1) / len > s_max) len = ((n_chunks + s_max - 1) / s_max + align - 1) / align * align;
  return std::min(len, std::max<int64_t>(n_chunks, 1));
}

template <int NT>
void launch_v3(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m, int64_t N, int64_t K,
               cudaStream_t stream) {
  const int64_t row_blocks = (N + 15) / 16, n_chunks = K / 8;
  const int64_t len = split_chunks_v3(N, K);
  const int64_t S = n_chunks > 0 ? (n_chunks + len - 1) / len : 1;
  KILN_CUDA_REQUIRE(S == 1 || S * row_blocks <= kSplitMaxBlocks, "gemv v3: split workspace too small");
  constexpr int U = NT == 1 ? 8 : 6;
  const dim3 grid{unsigned(row_blocks), unsigned(S)};
  gemv_split_kernel<NT, U, 4, 2><<<grid, 4 * 32, 0, stream>>>(x, w, bias, y, mode, m, N, K, len);
}

void gemv_v3(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m, int64_t N, int64_t K,
             cudaStream_t stream) {
  if (K % 8 != 0) return gemv_v1(x, w, bias, y, mode, m, N, K, stream);  // scalar path
  if (m <= 8)
    launch_v3<1>(x, w, bias, y, mode, m, N, K, stream);
  else
    launch_v3<2>(x, w, bias, y, mode, m, N, K, stream);
}

// The default: v3 where N / 16 row blocks leave the GPU short of work (< 4 per SM: qkv, o, down on
// an H200) and K is long enough to split, else v2.
// v3 measured slower than v2 on every shape it targets (see the header): off by default.
constexpr bool kDefaultSplitK = false;

bool use_v3(int64_t N, int64_t K) {
  if (K % 8 != 0) return false;
  const int64_t row_blocks = (N + 15) / 16;
  return row_blocks < 4 * int64_t(device_sm_count()) && split_chunks_v3(N, K) < K / 8;
}

}  // namespace

int gemv_versions() { return 6; }

void gemv_version(int version, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(M >= 1 && M <= kGemvMaxRows, "gemv takes 1..16 rows");
  KILN_CUDA_REQUIRE(version >= 0 && version <= gemv_versions(), "gemv: no such version");
  if (N == 0) return;
  const int m = int(M);
  if (version == 1)
    gemv_v1(x, w, bias, y, mode, m, N, K, stream);
  else if (version == 2 || (version == 0 && !(kDefaultSplitK && use_v3(N, K))))
    gemv_v2(x, w, bias, y, mode, m, N, K, stream, GemvLoop::plain);
  else if (version == 4)
    gemv_v2(x, w, bias, y, mode, m, N, K, stream, GemvLoop::pipelined);
  else if (version == 5 || version == 6) {
    const bool ran = version == 5 ? gemv_wgmma(x, w, bias, y, mode, M, N, K, stream)
                                  : gemv_wgmma_persistent(x, w, bias, y, mode, M, N, K, stream);
    if (!ran) gemv_v2(x, w, bias, y, mode, m, N, K, stream, GemvLoop::plain);  // not sm_90a, or K % 8 != 0
  } else
    gemv_v3(x, w, bias, y, mode, m, N, K, stream);
  KILN_CUDA_CHECK_LAUNCH();
}

void gemv(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
          cudaStream_t stream) {
  gemv_version(0, x, w, bias, y, mode, M, N, K, stream);
}

}  // namespace kiln::cuda
