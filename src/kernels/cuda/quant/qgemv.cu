// Decode GEMV with int8 / int4 weights (W8A16 / W4A16), 1 <= M <= 16: y = x . W^T, dequantization
// fused. Layout of W and of the scales: qmatmul.h.
//
// Structure: gemv.cu's v2 (tensor cores, measured 90% of the copy bandwidth on the large bf16
// shapes): a block owns 16 weight rows and splits K over W warps; lane (g, t) = (lane / 4, lane % 4)
// loads the 16-byte piece t of super-chunk sc of rows g and g + 8, U super-chunks per step, all
// weight loads of a step issued before any math. Each 32-bit word becomes MMA A fragments by
// SHF + LOP3 (nibble -> bf16 128 + q, exact); the activations' B fragment is one natural bf16x2 pair
// per fragment register (16-byte loads of x, L1/L2 resident). Per group, sum((off + q) x) and
// sum(x) (an MMA with an all-ones A) accumulate apart and fold into the row's fp32 accumulator as
// scale * acc + min' * xsum, so nothing is rounded but x (already bf16) and the fp32 sums: the result
// is the CPU reference's dequantize-then-dot up to summation order.
//
// Cost per 64 bytes of one weight row (a quad's super-chunk), per 8 activation rows (n-tile):
//   int4: 128 weights, 8 MMAs on q + 8 on ones, 4 x 4 SHF/LOP3 per row; int8: 64 weights, 8 + 4 MMAs.
//   At 4 TB/s an SM must consume ~17 weight bytes per clock: int4 needs ~0.27 MMA / clock / SM at
//   M <= 8 (mma.sync sustains ~0.6) and ~0.54 at M = 9..16 (close to the limit: the 16-row decode
//   of int4 can become MMA-bound); int8 ~0.2 / 0.4.
// Prediction (H200, 4.0-4.25 TB/s): large shapes (gate_up, lm_head) at 85-90% of copy like v2 on
// bf16, i.e. int4 gate_up ~17 us (66 MB), int8 ~33 us (132 MB); the small ones (o, qkv) are a few
// microseconds of DRAM time and stay launch/ramp-bound (~6-10 us).
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemv_reduce.cuh"
#include "kernels/cuda/mma_frag.cuh"
#include "kernels/cuda/quant/qmatmul.h"

namespace kiln::cuda {
namespace {

using namespace qk;

// Per format: k per super-chunk, bytes of a row.
template <QuantFormat F>
struct IntFormat;
template <>
struct IntFormat<QuantFormat::int4> {
  static constexpr int KS = 128;
  static __host__ __device__ int64_t row_bytes(int64_t K) { return K / 2; }
};
template <>
struct IntFormat<QuantFormat::int8> {
  static constexpr int KS = 64;
  static __host__ __device__ int64_t row_bytes(int64_t K) { return K; }
};

// Two independent accumulator chains (C = 2) per quantity: a warp's MMAs into one accumulator
// form a dependent sequence (~30 cycles each) during which it has no weight load in flight; the
// first version (one chain: 64 dependent MMAs per step) reached only 45-50% of copy (H200 run 1).
constexpr int C = 2;

// The per-group sums (q-sums and x-sums, both chains) of NT n-tiles folded into acc with the rows'
// float2 scales {scale, min'}, then cleared.
template <int NT>
__device__ __forceinline__ void fold(float (&acc)[NT][4], float (&qs)[C][NT][4], float (&xs)[C][NT][4], float2 s_lo,
                                     float2 s_hi) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 sc = e < 2 ? s_lo : s_hi;
      acc[j][e] += sc.x * (qs[0][j][e] + qs[1][j][e]) + sc.y * (xs[0][j][e] + xs[1][j][e]);
#pragma unroll
      for (int c = 0; c < C; ++c) qs[c][j][e] = xs[c][j][e] = 0.0f;
    }
  }
}

// One super-chunk of rows g / g + 8 (pieces a_lo / a_hi) against the activation rows xr[] at k0.
// Every activation (and, for groups of 32, scale) load of the super-chunk is issued before its
// first MMA. G32: fold after each 32-wide group (scales at group index g0 + i); else the caller folds.
template <QuantFormat F, bool G32, int NT>
__device__ __forceinline__ void superchunk(const uint4& a_lo, const uint4& a_hi, const bf16* const (&xr)[NT],
                                           const bool (&x_ok)[NT], int64_t k0, int t, float (&acc)[NT][4],
                                           float (&qs)[C][NT][4], float (&xs)[C][NT][4], const float2* s_lo,
                                           const float2* s_hi, int64_t g0) {
  constexpr int XL = F == QuantFormat::int4 ? 4 : 2;  // 16-byte activation loads per n-tile
  constexpr int NG = F == QuantFormat::int4 ? 4 : 2;  // 32-wide groups per super-chunk
  uint4 b[NT][XL];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < XL; ++i)
      b[n][i] = x_ok[n] ? __ldg(reinterpret_cast<const uint4*>(xr[n] + k0 + 32 * i + 8 * t)) : make_uint4(0, 0, 0, 0);
  float2 gl[G32 ? NG : 1], gh[G32 ? NG : 1];
  if constexpr (G32) {
#pragma unroll
    for (int i = 0; i < NG; ++i) {
      gl[i] = s_lo[g0 + i];
      gh[i] = s_hi[g0 + i];
    }
  }
  if constexpr (F == QuantFormat::int4) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t wl = word(a_lo, j), wh = word(a_hi, j);
      const uint32_t l0 = nibble_pair<0, 0x43004300u>(wl), l1 = nibble_pair<4, 0x43004300u>(wl),
                     l2 = nibble_pair<8, 0x43004300u>(wl), l3 = nibble_pair<12, 0x43004300u>(wl);
      const uint32_t h0 = nibble_pair<0, 0x43004300u>(wh), h1 = nibble_pair<4, 0x43004300u>(wh),
                     h2 = nibble_pair<8, 0x43004300u>(wh), h3 = nibble_pair<12, 0x43004300u>(wh);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint4& x = b[n][j];
        mma_bf16(qs[0][n], l0, h0, l1, h1, x.x, x.y);  // i = 0..3
        mma_bf16(qs[1][n], l2, h2, l3, h3, x.z, x.w);  // i = 4..7
        mma_bf16(xs[0][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, x.x, x.y);
        mma_bf16(xs[1][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, x.z, x.w);
      }
      if constexpr (G32) fold<NT>(acc, qs, xs, gl[j], gh[j]);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // word pairs (2h, 2h + 1): one 32-wide group
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const uint32_t wl = word(a_lo, 2 * h + jj), wh = word(a_hi, 2 * h + jj);
        const uint32_t lo02 = nibble_pair<0, 0x43004300u>(wl), hi02 = nibble_pair<4, 0x45004500u>(wl),
                       lo13 = nibble_pair<8, 0x43004300u>(wl), hi13 = nibble_pair<12, 0x45004500u>(wl);
        const uint32_t lo02h = nibble_pair<0, 0x43004300u>(wh), hi02h = nibble_pair<4, 0x45004500u>(wh),
                       lo13h = nibble_pair<8, 0x43004300u>(wh), hi13h = nibble_pair<12, 0x45004500u>(wh);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint32_t b0 = jj == 0 ? b[n][h].x : b[n][h].z, b1 = jj == 0 ? b[n][h].y : b[n][h].w;
          mma_bf16(qs[0][n], lo02, lo02h, lo13, lo13h, b0, b1);
          mma_bf16(qs[1][n], hi02, hi02h, hi13, hi13h, b0, b1);
          mma_bf16(xs[jj][n], kBf16Ones, kBf16Ones, kBf16Ones, kBf16Ones, b0, b1);
        }
      }
      if constexpr (G32) fold<NT>(acc, qs, xs, gl[h], gh[h]);
    }
  }
}

// NT n-tiles of 8 activation rows; U super-chunks per warp step; W warps split K. G32: groups of 32,
// else the group is a multiple of the super-chunk (folded once per super-chunk, its scales loaded
// with the step's weights).
template <QuantFormat F, bool G32, int NT, int U, int W>
__global__ void __launch_bounds__(W * 32, 16 / W)
    qgemv_kernel(const bf16* __restrict__ x, const uint8_t* __restrict__ wq, const float2* __restrict__ scales,
                 const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode, int m_actual, int64_t N, int64_t K,
                 int64_t group) {
  using Fmt = IntFormat<F>;
  __shared__ float red[W][16][8 * NT + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t n_sc = K / Fmt::KS, groups = K / group;
  const int64_t r_lo = imin64(row0 + g, N - 1), r_hi = imin64(row0 + g + 8, N - 1);
  const uint4* w_lo = reinterpret_cast<const uint4*>(wq + r_lo * Fmt::row_bytes(K));
  const uint4* w_hi = reinterpret_cast<const uint4*>(wq + r_hi * Fmt::row_bytes(K));
  const float2* s_lo = scales + r_lo * groups;
  const float2* s_hi = scales + r_hi * groups;
  const bf16* xr[NT];
  bool x_ok[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    x_ok[n] = 8 * n + g < m_actual;
    xr[n] = x + (x_ok[n] ? int64_t(8 * n + g) * K : 0);
  }
  float acc[NT][4], qs[C][NT][4], xs[C][NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[n][e] = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) qs[c][n][e] = xs[c][n][e] = 0.0f;
    }

  // The loop bound is warp-uniform (mma.sync needs the whole warp).
  for (int64_t step = int64_t(warp) * U; step < n_sc; step += int64_t(W) * U) {
    uint4 a_lo[U], a_hi[U];
    float2 sl[G32 ? 1 : U], sh[G32 ? 1 : U];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every weight (and scale) load first: they are what the kernel waits on
      const int64_t sc = step + u;
      if (sc < n_sc) {
        a_lo[u] = ld_weight(w_lo + 4 * sc + t);
        a_hi[u] = ld_weight(w_hi + 4 * sc + t);
      } else {
        a_lo[u] = a_hi[u] = make_uint4(0, 0, 0, 0);
      }
    }
    if constexpr (!G32) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t gi = imin64(step + u, n_sc - 1) * Fmt::KS / group;
        sl[u] = s_lo[gi];
        sh[u] = s_hi[gi];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t sc = step + u;
      if (sc >= n_sc) break;
      const int64_t k0 = sc * Fmt::KS;
      superchunk<F, G32, NT>(a_lo[u], a_hi[u], xr, x_ok, k0, t, acc, qs, xs, s_lo, s_hi, k0 / 32);
      if constexpr (!G32) fold<NT>(acc, qs, xs, sl[u], sh[u]);
    }
  }

  gemv_stash<W, NT>(red, warp, g, t, acc);
  gemv_meet<W, NT>(
      red, row0, m_actual, N, [&](int64_t n) { return bias ? __bfloat162float(bias[n]) : 0.0f; },
      [&](int m, int64_t n, float v) { store_out(y, mode, int64_t(m) * N + n, v); });
}

// ---- v2: the weight stream through a per-warp cp.async ring in shared memory ----
// v1 (above) holds a step's weights in registers: at <= 128 registers int4 affords U = 4 super-chunks
// (4 KB per warp) and the warp has nothing in flight while it computes (H200 run 2: gate_up 52% of
// copy, int8 54%, against 78% for the lighter fp8 GEMV). Here each lane cp.asyncs its own 16-byte
// pieces (rows g and g + 8) and its rows' scales for P - 1 steps ahead into a ring of P stages, waits
// for the oldest, reads it back (its own bytes: no barrier), computes, and refills: (P - 1) * U KB of
// weights stay in flight per warp through the compute, without registers.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(uint32_t(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(uint32_t(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int U, int P, int W>
struct Ring {
  uint4 w[W][P][U][2][32];    // [warp][stage][super-chunk][row g / g + 8][lane]
  float2 s[W][P][U][2][32];   // the rows' {scale, min'} of that super-chunk (groups >= 64 only)
};

template <QuantFormat F, bool G32, int NT, int U, int P, int W>
__global__ void __launch_bounds__(W * 32)
    qgemv_async_kernel(const bf16* __restrict__ x, const uint8_t* __restrict__ wq, const float2* __restrict__ scales,
                       const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode, int m_actual, int64_t N,
                       int64_t K, int64_t group) {
  using Fmt = IntFormat<F>;
  extern __shared__ uint4 smem_raw[];
  Ring<U, P, W>& ring = *reinterpret_cast<Ring<U, P, W>*>(smem_raw);
  __shared__ float red[W][16][8 * NT + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t n_sc = K / Fmt::KS, groups = K / group;
  const int64_t r_lo = imin64(row0 + g, N - 1), r_hi = imin64(row0 + g + 8, N - 1);
  const uint4* w_lo = reinterpret_cast<const uint4*>(wq + r_lo * Fmt::row_bytes(K));
  const uint4* w_hi = reinterpret_cast<const uint4*>(wq + r_hi * Fmt::row_bytes(K));
  const float2* s_lo = scales + r_lo * groups;
  const float2* s_hi = scales + r_hi * groups;
  const bf16* xr[NT];
  bool x_ok[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    x_ok[n] = 8 * n + g < m_actual;
    xr[n] = x + (x_ok[n] ? int64_t(8 * n + g) * K : 0);
  }
  float acc[NT][4], qs[C][NT][4], xs[C][NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[n][e] = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) qs[c][n][e] = xs[c][n][e] = 0.0f;
    }
  // Warp steps: super-chunks [first + i * W * U, + U) for i = 0 .. n_steps - 1.
  const int64_t first = int64_t(warp) * U, stride = int64_t(W) * U;
  const int64_t n_steps = first < n_sc ? (n_sc - first + stride - 1) / stride : 0;
  auto issue = [&](int64_t i) {  // step i's pieces (and scales) into stage i % P; always commits a group
    if (i < n_steps) {
      const int st = int(i % P);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t sc = first + i * stride + u;
        if (sc < n_sc) {
          cp_async16(&ring.w[warp][st][u][0][lane], w_lo + 4 * sc + t);
          cp_async16(&ring.w[warp][st][u][1][lane], w_hi + 4 * sc + t);
          if constexpr (!G32) {
            const int64_t gi = sc * Fmt::KS / group;
            cp_async8(&ring.s[warp][st][u][0][lane], s_lo + gi);
            cp_async8(&ring.s[warp][st][u][1][lane], s_hi + gi);
          }
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < P - 1; ++i) issue(i);
  for (int64_t i = 0; i < n_steps; ++i) {  // warp-uniform
    issue(i + P - 1);
    cp_async_wait<P - 1>();  // step i's group has landed (this lane's own bytes)
    const int st = int(i % P);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t sc = first + i * stride + u;
      if (sc >= n_sc) break;
      const int64_t k0 = sc * Fmt::KS;
      const uint4 a_lo = ring.w[warp][st][u][0][lane], a_hi = ring.w[warp][st][u][1][lane];
      superchunk<F, G32, NT>(a_lo, a_hi, xr, x_ok, k0, t, acc, qs, xs, s_lo, s_hi, k0 / 32);
      if constexpr (!G32) fold<NT>(acc, qs, xs, ring.s[warp][st][u][0][lane], ring.s[warp][st][u][1][lane]);
    }
  }
  cp_async_wait<0>();

  gemv_stash<W, NT>(red, warp, g, t, acc);
  gemv_meet<W, NT>(
      red, row0, m_actual, N, [&](int64_t n) { return bias ? __bfloat162float(bias[n]) : 0.0f; },
      [&](int m, int64_t n, float v) { store_out(y, mode, int64_t(m) * N + n, v); });
}

template <QuantFormat F, bool G32, int NT>
void launch(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int m, cudaStream_t stream) {
  const int64_t blocks = (w.rows + 15) / 16;
  // Weight loads in flight per lane: 2U (int4 holds 4 activation vectors per super-chunk: fewer).
  constexpr int U = F == QuantFormat::int4 ? (NT == 1 ? 4 : 2) : (NT == 1 ? 6 : 4);
  const auto* sc = static_cast<const float2*>(static_cast<const void*>(w.scales));
  const auto* q = static_cast<const uint8_t*>(w.data);
  // As gemv v2: 8-warp blocks when the grid is at most two blocks per SM, else 4-warp blocks (up to
  // 4 resident per SM).
  if (blocks <= 2 * int64_t(device_sm_count()))
    qgemv_kernel<F, G32, NT, U, 8><<<unsigned(blocks), 8 * 32, 0, stream>>>(x, q, sc, bias, y, mode, m, w.rows,
                                                                            w.cols, w.group);
  else
    qgemv_kernel<F, G32, NT, U, 4><<<unsigned(blocks), 4 * 32, 0, stream>>>(x, q, sc, bias, y, mode, m, w.rows,
                                                                            w.cols, w.group);
}

// v2's ring: U = 2 super-chunks per step, P = 4 stages (6 KB of weights in flight per warp through
// the compute); a 4-warp block's ring is 32 KB of weights + 16 KB of scales, 4 blocks per SM.
template <QuantFormat F, bool G32, int NT>
void launch_async(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int m,
                  cudaStream_t stream) {
  constexpr int U = 2, P = 4, W = 4;
  const int64_t blocks = (w.rows + 15) / 16;
  const auto* sc = static_cast<const float2*>(static_cast<const void*>(w.scales));
  const auto* q = static_cast<const uint8_t*>(w.data);
  auto kernel = qgemv_async_kernel<F, G32, NT, U, P, W>;
  constexpr int smem = int(sizeof(Ring<U, P, W>));
  static bool configured = false;  // raising the dynamic shared-memory limit once is enough
  if (!configured) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  kernel<<<unsigned(blocks), W * 32, smem, stream>>>(x, q, sc, bias, y, mode, m, w.rows, w.cols, w.group);
}

// 0: default (v3, qgemv_v3.cu), 1: v1 registers, 2: v1's cp.async ring, 3: v3, 4: v3 with x from L2
// and the all-ones x sums, 5: v3 with one tile per block (qgemv_set_version, the lab). v2 measured slower than v1 on every shape
// (H200 run 3: int4 gate_up 44.0 vs 32.7 us, down 31.0 vs 21.8 us); its cp.async requests lacked the
// .L2::256B fetch of v1's loads and its activation loads sat behind the wait on the ring.
int g_version = 0;

template <QuantFormat F>
void dispatch(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int m, cudaStream_t stream) {
  const bool g32 = w.group == 32;
  if (g_version == 1) {
    if (m <= 8)
      g32 ? launch<F, true, 1>(x, w, bias, y, mode, m, stream) : launch<F, false, 1>(x, w, bias, y, mode, m, stream);
    else
      g32 ? launch<F, true, 2>(x, w, bias, y, mode, m, stream) : launch<F, false, 2>(x, w, bias, y, mode, m, stream);
    return;
  }
  if (m <= 8)
    g32 ? launch_async<F, true, 1>(x, w, bias, y, mode, m, stream)
        : launch_async<F, false, 1>(x, w, bias, y, mode, m, stream);
  else
    g32 ? launch_async<F, true, 2>(x, w, bias, y, mode, m, stream)
        : launch_async<F, false, 2>(x, w, bias, y, mode, m, stream);
}

}  // namespace

bool qgemv_v3(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int m, bool allow_xs,
              bool persist, cudaStream_t stream);  // qgemv_v3.cu

void qgemv_set_version(int version) { g_version = version; }

void qgemv(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int64_t M, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(M >= 1 && M <= kGemvMaxRows, "qgemv takes 1..16 rows");
  KILN_CUDA_REQUIRE(w.format == QuantFormat::int8 || w.format == QuantFormat::int4, "qgemv: int8 or int4 weights");
  KILN_CUDA_REQUIRE(qweight_packable(w.format, w.cols, w.group), "qgemv: shape not in the packed layout");
  if (w.rows == 0) return;
  if ((g_version == 0 || g_version >= 3) &&
      qgemv_v3(x, w, bias, y, mode, int(M), g_version != 4, g_version != 5, stream)) {
    // v3 ran
  } else if (w.format == QuantFormat::int4)
    dispatch<QuantFormat::int4>(x, w, bias, y, mode, int(M), stream);
  else
    dispatch<QuantFormat::int8>(x, w, bias, y, mode, int(M), stream);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
