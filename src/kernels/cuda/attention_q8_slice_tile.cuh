// The slice step of attention_decode_q8_slices.cu (device code, included only there): one warp, the
// <= 8 query heads of a (sequence, KV head) pair against a 16-position slice of the 8-bit cache,
// computed transposed so that no MMA row is wasted and V never becomes a bf16 tile.
//
// Session 23's first slice kernel used the split kernel's step (attention_q8_tile.cuh: S = Q K^T
// with the heads as the 16 MMA rows, of which a pair fills at most 8; V converted into a bf16 tile
// for ldmatrix.trans): 32 MMAs a slice, and the kernel lab measured it at the bf16 slice kernel's
// slice rate (48% of copy on the bytes it reads): a warp's slice is a chain of dependent steps, and
// 8 warps a SM do not hide it. Here:
//   S^T = K Q^T    K is the A operand (16 keys = the 16 rows), straight from its bytes as
//                  attend_q8_kreg takes them (lane (g, t): bytes [t D/4, (t + 1) D/4) of keys g and
//                  g + 8, so step kk sums dims t D/4 + 4 kk .. + 3); Q^T the B operand (its 8
//                  columns the heads, from row g of the pair's q slot in the same order). D/16 MMAs,
//                  on two accumulators (even / odd steps) to halve the dependent chain.
//   softmax        per head column: lane (g, t) holds keys g and g + 8 of heads 2t and 2t + 1, the max
//                  runs over g (3 shuffles a head); the running max, sum and rescale are lane-local.
//   P^T -> B       P^T (keys x heads) times the V scale of its key, rounded to bf16, is an m8n8 b16
//                  fragment per 8 keys; movmatrix.trans turns it into the B fragment of
//   O^T = V^T P^T  V^T is the A operand (16 dims = rows, 16 keys = k): lane g takes D/8 consecutive
//                  dims of keys 2t, 2t + 1, 2t + 8, 2t + 9 (one 16-byte load each at d 128) and
//                  pairs the keys' bytes with PRMT before the byte -> bf16 conversion; row g of
//                  tile mt is dim (D/8) g + mt and row g + 8 is dim (D/8) g + D/16 + mt, so the
//                  lane's outputs are D/8 consecutive dims of heads 2t and 2t + 1. D/16 MMAs.
// 2 D/16 MMAs a slice (16 at d 128, against 32), no V tile (4 KB less shared memory a warp), no
// ldmatrix, half the output registers (O^T is (D, 8), not (16, D)).
// The operands are f16, not bf16 (version 3): every int8 and e4m3 value is an f16 value, and the
// bytes become f16 pairs in fewer instructions (fp8: one cvt.rn.f16x2.e4m3x2 a pair; int8: one PRMT
// and one subtraction a pair, bytes_to_f16x2) than bf16 pairs (bytes_to_bf16x2: masks, shifts and a
// multiply). q, whose range f16 does not cover, is scaled by a power of two per pair (amax <= 2^14)
// and the scores unscaled with the K scale; P^T times the V scale is in [0, v_scale], f16's normal
// range down to 2^-14 (below it, subnormal: an absolute error under 2^-25 a term).
// Numerics: the split kernel's (scores q . byte times the K scale in fp32, P times the V scale
// rounded to a 16-bit float: here f16's 11 bits, not bf16's 8), sums in another order.
#pragma once

#include <cuda_fp16.h>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_q8_tile.cuh"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/mma_frag.cuh"

namespace kiln::cuda::attn_q8s {

using namespace attn;
constexpr int kSlice = attn_q8::kWarpKeys;  // 16 positions

__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Where 16-byte chunk c of row r of a slice's raw V bytes sits: at d 128 the chunks of rows 2t (2t
// + 1, 2t + 8, 2t + 9) are turned by 2t, so the 8 lanes of a quarter warp (chunks g = 0, 1 of
// rows of t = 0..3) hit 8 different bank groups. At d 64 (8-byte loads) unswizzled.
template <int D>
__device__ __forceinline__ int vchunk(int r, int c) {
  return D == 128 ? (c ^ (((r >> 1) & 3) << 1)) : c;
}

// Four bytes (b0..b3) -> f16 pairs (b0, b1) and (b2, b3), exactly.
//   int8: 0x6400 | (b ^ 0x80) is the f16 1024 + (b + 128); minus 1152 is b.
//   fp8:  cvt.rn.f16x2.e4m3x2 on each 16-bit half (sm_89+; mma_frag.cuh's e4m3x4_to_f16x2x2, with an
//         integer form for sm_80).
template <KvQuant F>
__device__ __forceinline__ void bytes_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (F == KvQuant::int8) {
    const uint32_t x = w ^ 0x80808080u, k = 0x64806480u;  // (1152, 1152)
    // Bytes (x.b0, 0x64, x.b1, 0x64) and (x.b2, 0x64, x.b3, 0x64): selectors 4 and 5 are 0x6464's bytes.
    const uint32_t a = __byte_perm(x, 0x6464u, 0x5140), b = __byte_perm(x, 0x6464u, 0x5342);
    const __half2 r0 = __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&k));
    const __half2 r1 = __hsub2(*reinterpret_cast<const __half2*>(&b), *reinterpret_cast<const __half2*>(&k));
    lo = *reinterpret_cast<const uint32_t*>(&r0);
    hi = *reinterpret_cast<const uint32_t*>(&r1);
  } else {
    qk::e4m3x4_to_f16x2x2(w, lo, hi);
  }
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Q^T's B fragments of the pair's q slot (swizzled (rows, D) bf16, row g = head g < group) in f16:
// step kk holds dims t D/4 + 4 kk .. + 3 of head g (the order K's bytes are summed in), times 2^-e,
// e >= 0 the least that brings the pair's largest |q| to <= 2^14; returns 2^e, the scores' factor.
template <int D>
__device__ __forceinline__ float load_qt_frags(uint32_t (&qb)[D / 16][2], const bf16* qs, int group) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  float2 v[D / 16][2];
  float amax = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int d0 = (D / 4) * t + 4 * kk;
    const uint2 w = *reinterpret_cast<const uint2*>(qs + swz<D>(g, d0 / 8) + d0 % 8);
    v[kk][0] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.x));
    v[kk][1] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.y));
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[kk][0].x), fabsf(v[kk][0].y)), fmaxf(fabsf(v[kk][1].x), fabsf(v[kk][1].y))));
  }
  // One factor for the pair (a lane's scores are of heads 2t, 2t + 1, not its row g); rows >= group
  // hold other data and are left out.
  if (g >= group) amax = 0.0f;
#pragma unroll
  for (int x = 1; x < 32; x *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, x));
  int e = 0;
  if (amax > 16384.0f) e = min(ilogbf(amax) - 13, 127);
  const float down = exp2f(float(-e));
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qb[kk][0] = pack_f16(v[kk][0].x * down, v[kk][0].y * down);
    qb[kk][1] = pack_f16(v[kk][1].x * down, v[kk][1].y * down);
  }
  return exp2f(float(e));
}

// The D/8 bytes of dims (D/8) g .. of key row r of the raw V slice, as D/32 words.
template <int D>
__device__ __forceinline__ void load_v_words(const uint8_t* vraw, int r, int g, uint32_t (&w)[D / 32]) {
  if constexpr (D == 128) {
    const uint4 c = *reinterpret_cast<const uint4*>(vraw + (r * 8 + vchunk<D>(r, g)) * 16);
    w[0] = c.x, w[1] = c.y, w[2] = c.z, w[3] = c.w;
  } else {
    const uint2 c = *reinterpret_cast<const uint2*>(vraw + r * D + g * (D / 8));
    w[0] = c.x, w[1] = c.y;
  }
}

// Keys a and b's bytes of the same D/8 dims -> f16x2 (key a low, key b high) for each dim offset.
template <int D, KvQuant F>
__device__ __forceinline__ void pair_keys(const uint32_t (&a)[D / 32], const uint32_t (&b)[D / 32],
                                          uint32_t (&p)[D / 8]) {
#pragma unroll
  for (int w = 0; w < D / 32; ++w) {
    bytes_to_f16x2<F>(__byte_perm(a[w], b[w], 0x5140), p[4 * w], p[4 * w + 1]);
    bytes_to_f16x2<F>(__byte_perm(a[w], b[w], 0x7362), p[4 * w + 2], p[4 * w + 3]);
  }
}

// One slice: kraw = K bytes (16, D) with chunks placed by attn_q8::kchunk<D, 2>, vraw = V bytes with
// chunks placed by vchunk, sk / sv the 16 keys' scales; n_keys valid keys (kMask: < 16); heads >=
// group are padding (group <= 0: rescale every slice, the comparison for the skip below). m, l:
// running max (raw scores) and this lane's partial sum for heads 2t, 2t + 1; o: O^T (D/16 tiles of
// (16 dims, 8 heads), C layout). q_up: load_qt_frags's factor.
template <int D, KvQuant F, bool kMask>
__device__ __forceinline__ void attend_slice(const uint32_t (&qb)[D / 16][2], float q_up, const uint8_t* kraw,
                                             const uint8_t* vraw, const float* sk, const float* sv, int n_keys,
                                             int group, float (&m)[2], float (&l)[2], float (&o)[D / 16][4],
                                             float scale_log2) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  // S^T = K Q^T.
  uint32_t kw[2][D / 16];  // the lane's bytes of key rows g and g + 8, 4 a word
  attn_q8::load_k_words<D>(kraw, kw);
  float s[4] = {}, s_odd[4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a0, a1, a2, a3;
    bytes_to_f16x2<F>(kw[0][kk], a0, a2);
    bytes_to_f16x2<F>(kw[1][kk], a1, a3);
    qk::mma_f16(kk & 1 ? s_odd : s, a0, a1, a2, a3, qb[kk][0], qb[kk][1]);
  }
  // s: (key g, head 2t), (key g, head 2t + 1), (key g + 8, head 2t), (key g + 8, head 2t + 1).
  const float kg = sk[g] * q_up, kg8 = sk[g + 8] * q_up;
  s[0] = (s[0] + s_odd[0]) * kg, s[1] = (s[1] + s_odd[1]) * kg;
  s[2] = (s[2] + s_odd[2]) * kg8, s[3] = (s[3] + s_odd[3]) * kg8;
  if (kMask) {
    if (g >= n_keys) s[0] = s[1] = -INFINITY;
    if (g + 8 >= n_keys) s[2] = s[3] = -INFINITY;
  }
  // Online softmax per head column (heads 2t, 2t + 1: i = 0, 1).
  float corr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = fmaxf(m[i], fmaxf(s[i], s[i + 2]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;
    corr[i] = exp2f(m[i] * scale_log2 - base);
    m[i] = mx;
    s[i] = exp2f(fmaf(s[i], scale_log2, -base));
    s[i + 2] = exp2f(fmaf(s[i + 2], scale_log2, -base));
    l[i] = l[i] * corr[i] + s[i] + s[i + 2];
  }
  // corr is exactly 1 (exp2f(0)) for a head whose running max did not move. Once the first slices
  // have set the maxima most slices move none, and then the D/4 multiplies of the rescale (the FMA
  // pipe's largest share of a slice) are skipped: the same bits. Padding heads (>= group) do not
  // vote; their outputs are never stored.
  const bool moved =
      group <= 0 || (2 * t < group && corr[0] != 1.0f) || (2 * t + 1 < group && corr[1] != 1.0f);
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      o[mt][0] *= corr[0], o[mt][1] *= corr[1];
      o[mt][2] *= corr[0], o[mt][3] *= corr[1];
    }
  }
  // P^T times the V scales -> the B fragments of O^T = V^T P^T.
  const float vg = sv[g], vg8 = sv[g + 8];
  const uint32_t b0 = movmatrix_trans(pack_f16(s[0] * vg, s[1] * vg));      // keys 2t, 2t + 1 of head g
  const uint32_t b1 = movmatrix_trans(pack_f16(s[2] * vg8, s[3] * vg8));  // keys 2t + 8, 2t + 9
  // V^T's A fragments: keys (2t, 2t + 1) and (2t + 8, 2t + 9) paired per dim.
  uint32_t pa[D / 8], pb[D / 8];
  {
    uint32_t w0[D / 32], w1[D / 32];
    load_v_words<D>(vraw, 2 * t, g, w0);
    load_v_words<D>(vraw, 2 * t + 1, g, w1);
    pair_keys<D, F>(w0, w1, pa);
    load_v_words<D>(vraw, 2 * t + 8, g, w0);
    load_v_words<D>(vraw, 2 * t + 9, g, w1);
    pair_keys<D, F>(w0, w1, pb);
  }
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    qk::mma_f16(o[mt], pa[mt], pa[D / 16 + mt], pb[mt], pb[D / 16 + mt], b0, b1);
  }
}

// The pair's normalized outputs: heads 2t and 2t + 1 (those < group) of this lane, dims (D/8) g ..
// (those < d; d % 16 == 0), to out_rows (the pair's first head's output row, rows d apart).
template <int D>
__device__ __forceinline__ void store_slice_out(const float (&o)[D / 16][4], const float (&l)[2], bf16* out_rows,
                                                int group, int d) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float den = l[i];
    den += __shfl_xor_sync(0xffffffffu, den, 4);
    den += __shfl_xor_sync(0xffffffffu, den, 8);
    den += __shfl_xor_sync(0xffffffffu, den, 16);
    const int h = 2 * t + i, d0 = (D / 8) * g;
    if (h >= group || d0 >= d) continue;
    const float inv = 1.0f / den;
    uint32_t packed[D / 16];
#pragma unroll
    for (int mt = 0; mt < D / 16; mt += 2) {
      packed[mt / 2] = pack_bf16(o[mt][i] * inv, o[mt + 1][i] * inv);                // dims d0 + mt, + 1
      packed[D / 32 + mt / 2] = pack_bf16(o[mt][2 + i] * inv, o[mt + 1][2 + i] * inv);  // dims d0 + D/16 + mt
    }
    uint4* dst = reinterpret_cast<uint4*>(out_rows + int64_t(h) * d + d0);
#pragma unroll
    for (int v = 0; v < D / 64; ++v) dst[v] = make_uint4(packed[4 * v], packed[4 * v + 1], packed[4 * v + 2], packed[4 * v + 3]);
  }
}

}  // namespace kiln::cuda::attn_q8s
