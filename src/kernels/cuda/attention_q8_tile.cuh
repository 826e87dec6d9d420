// The per-warp tile step of attention_decode_q8.cu (device code, included only there): one warp,
// the 16 query rows of its block against its 16 keys of a 64-position tile of the quantized cache.
//   attend_q8       (version 1): K and V converted to swizzled bf16 tiles in shared memory, then
//                   attention_mma.h's ldmatrix / mma.sync code (attend_tile) with the scales applied.
//   attend_q8_kreg  (version 2, the default): K's bytes go from shared memory straight into the B
//                   fragments of Q.K^T (no bf16 K tile, no ldmatrix of K): lane (g, t) takes the
//                   contiguous bytes [t D/4, (t + 1) D/4) of key rows g and g + 8, so mma step kk
//                   sums dims t D/4 + 4 kk .. + 3 in place of 16 kk + 2 t, 2 t + 1, 2 t + 8, 2 t + 9;
//                   Q's A fragments are loaded with the same permutation (load_q_frags_perm). The
//                   dot products are the same sums in another order. V keeps its bf16 tile (P.V
//                   needs it transposed, which ldmatrix.trans does). Frees 8 KB of shared memory per
//                   warp for a fifth cp.async stage.
// Both apply the scales in fp32 where they are per key: score column * K scale, probability * V
// scale before its bf16 rounding for P.V (the softmax sum uses the unscaled probability).
#pragma once

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/kv_quant.cuh"

namespace kiln::cuda::attn_q8 {

using namespace attn;
constexpr int kWarpKeys = 16;

// Where a 16-byte chunk c of key row r of a warp's raw K bytes sits (in chunks from the row's start):
// version 2 at D = 128 swaps neighbouring chunks on odd rows, so the two rows a quarter-warp reads
// (g = 0/1 with t = 0..3, chunks 2t or 2t + 1) fall in 8 different bank groups.
template <int D, int kV>
__device__ __forceinline__ int kchunk(int r, int c) {
  return (kV == 2 && D == 128) ? (c ^ (r & 1)) : c;
}

// Online softmax of the 2 x 4 scores of this lane (keys 8 j + 2 t + (e & 1)), already scaled and
// masked, into m / l / o; leaves the probabilities in s.
template <int D>
__device__ __forceinline__ void softmax_step(float (&s)[2][4], float (&m)[2], float (&l)[2], float (&o)[D / 8][4],
                                             float scale_log2) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = m[i];
#pragma unroll
    for (int j = 0; j < 2; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;
    const float corr = exp2f(m[i] * scale_log2 - base);
    m[i] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][2 * i] = exp2f(fmaf(s[j][2 * i], scale_log2, -base));
      s[j][2 * i + 1] = exp2f(fmaf(s[j][2 * i + 1], scale_log2, -base));
      sum += s[j][2 * i] + s[j][2 * i + 1];
    }
    l[i] = l[i] * corr + sum;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][2 * i] *= corr, o[n][2 * i + 1] *= corr;
  }
}

// Scores times their key's K scale, keys at or past n_keys masked; returns the V scales of the
// lane's 4 keys in vscale.
template <bool kMask>
__device__ __forceinline__ void scale_and_mask(float (&s)[2][4], const float* sk, const float* sv, int n_keys,
                                               float (&vscale)[2][2]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float2 k2 = *reinterpret_cast<const float2*>(sk + 8 * j + 2 * t);
    const float2 v2 = *reinterpret_cast<const float2*>(sv + 8 * j + 2 * t);
    vscale[j][0] = v2.x, vscale[j][1] = v2.y;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] *= (e & 1) ? k2.y : k2.x;
      if (kMask && 8 * j + 2 * t + (e & 1) >= n_keys) s[j][e] = -INFINITY;
    }
  }
}

// O += (P * v_scale) V, V from the warp's swizzled bf16 tile (16 keys).
template <int D>
__device__ __forceinline__ void pv_step(const float (&s)[2][4], const float (&vscale)[2][2], const bf16* vs,
                                        float (&o)[D / 8][4]) {
  const int lane = threadIdx.x % 32;
  uint32_t a[4];
  a[0] = pack_bf16(s[0][0] * vscale[0][0], s[0][1] * vscale[0][1]);
  a[1] = pack_bf16(s[0][2] * vscale[0][0], s[0][3] * vscale[0][1]);
  a[2] = pack_bf16(s[1][0] * vscale[1][0], s[1][1] * vscale[1][1]);
  a[3] = pack_bf16(s[1][2] * vscale[1][0], s[1][3] * vscale[1][1]);
  const int key_in = (lane & 7) + (((lane >> 3) & 1) << 3), chunk_in = lane >> 4;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, vs + swz<D>(key_in, n * 2 + chunk_in));
    mma_bf16(o[2 * n], a, b[0], b[1]);
    mma_bf16(o[2 * n + 1], a, b[2], b[3]);
  }
}

// Version 1: K from its swizzled bf16 tile.
template <int D, bool kMask>
__device__ __forceinline__ void attend_q8(const uint32_t (&qf)[D / 16][4], const bf16* ks, const bf16* vs,
                                          const float* sk, const float* sv, int n_keys, float (&m)[2], float (&l)[2],
                                          float (&o)[D / 8][4], float scale_log2) {
  const int lane = threadIdx.x % 32;
  float s[2][4] = {};
  const int key_in = (lane & 7) + ((lane >> 4) << 3), chunk_in = (lane >> 3) & 1;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t b[4];
    ldmatrix_x4(b, ks + swz<D>(key_in, kk * 2 + chunk_in));
    mma_bf16(s[0], qf[kk], b[0], b[1]);
    mma_bf16(s[1], qf[kk], b[2], b[3]);
  }
  float vscale[2][2];
  scale_and_mask<kMask>(s, sk, sv, n_keys, vscale);
  softmax_step<D>(s, m, l, o, scale_log2);
  pv_step<D>(s, vscale, vs, o);
}

// This lane's K bytes for the K-in-registers steps (here and attention_q8_slice_tile.cuh): of the
// warp's raw (16, D) rows (chunks placed by kchunk), bytes [t D/4, (t + 1) D/4) of key rows g (w[0])
// and g + 8 (w[1]), 4 a word.
template <int D>
__device__ __forceinline__ void load_k_words(const uint8_t* kraw, uint32_t (&w)[2][D / 16]) {
  constexpr int kCh = D / 16, kLaneCh = D / 64;  // 16-byte chunks of a row; of a lane's share of it
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = 8 * j + g;
#pragma unroll
    for (int u = 0; u < kLaneCh; ++u) {
      const uint4 c = *reinterpret_cast<const uint4*>(kraw + (r * kCh + kchunk<D, 2>(r, kLaneCh * t + u)) * 16);
      w[j][4 * u] = c.x, w[j][4 * u + 1] = c.y, w[j][4 * u + 2] = c.z, w[j][4 * u + 3] = c.w;
    }
  }
}

// Version 2: K's bytes (the warp's raw (16, D) rows, chunks placed by kchunk) into the B
// fragments directly; qf from load_q_frags_perm.
template <int D, KvQuant F, bool kMask>
__device__ __forceinline__ void attend_q8_kreg(const uint32_t (&qf)[D / 16][4], const uint8_t* kraw, const bf16* vs,
                                               const float* sk, const float* sv, int n_keys, float (&m)[2],
                                               float (&l)[2], float (&o)[D / 8][4], float scale_log2) {
  uint32_t w[2][D / 16];
  load_k_words<D>(kraw, w);
  float s[2][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t lo, hi;
      kvq::bytes_to_bf16x2<F>(w[j][kk], lo, hi);
      mma_bf16(s[j], qf[kk], lo, hi);
    }
  }
  float vscale[2][2];
  scale_and_mask<kMask>(s, sk, sv, n_keys, vscale);
  softmax_step<D>(s, m, l, o, scale_log2);
  pv_step<D>(s, vscale, vs, o);
}

// Q fragments for attend_q8_kreg: step kk holds dims t D/4 + 4 kk .. + 3 of rows g and g + 8 (a0 /
// a1 the first two, a2 / a3 the next two), from the swizzled (16, D) q tile.
template <int D>
__device__ __forceinline__ void load_q_frags_perm(uint32_t (&qf)[D / 16][4], const bf16* qs) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int d0 = (D / 4) * t + 4 * kk;
    const uint2 lo = *reinterpret_cast<const uint2*>(qs + swz<D>(g, d0 / 8) + d0 % 8);
    const uint2 hi = *reinterpret_cast<const uint2*>(qs + swz<D>(g + 8, d0 / 8) + d0 % 8);
    qf[kk][0] = lo.x, qf[kk][2] = lo.y, qf[kk][1] = hi.x, qf[kk][3] = hi.y;
  }
}

// Bytes (a warp's 16 rows, row-major, D bytes a row) -> the swizzled bf16 tile: this lane's chunks.
template <int D, KvQuant F>
__device__ __forceinline__ void convert_rows(const uint8_t* raw, bf16* tile) {
  constexpr int kCh = D / 16, kPer = kWarpKeys * kCh / 32;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    const int i = it * 32 + lane, r = i / kCh, c = i % kCh;
    const uint4 w = *reinterpret_cast<const uint4*>(raw + i * 16);
    uint4 lo, hi;
    kvq::bytes_to_bf16x2<F>(w.x, lo.x, lo.y);
    kvq::bytes_to_bf16x2<F>(w.y, lo.z, lo.w);
    kvq::bytes_to_bf16x2<F>(w.z, hi.x, hi.y);
    kvq::bytes_to_bf16x2<F>(w.w, hi.z, hi.w);
    *reinterpret_cast<uint4*>(tile + swz<D>(r, 2 * c)) = lo;
    *reinterpret_cast<uint4*>(tile + swz<D>(r, 2 * c + 1)) = hi;
  }
}

}  // namespace kiln::cuda::attn_q8
