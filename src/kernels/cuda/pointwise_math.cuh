// The arithmetic of RoPE and SwiGLU, shared by their stand-alone kernels (elementwise.cu) and by
// the decode GEMVs that fold them into their epilogues (gemv_fused.cu). One definition, written with
// explicit rounding intrinsics (the compiler may not contract x0 c - x1 s into an FMA one way in one
// kernel and another way in the other), so both paths produce the same bits: the fused decode step
// is tested equal to the unfused one, not merely close.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/common.h"

namespace kiln::cuda {

// --- RoPE ---

// sin / cos of position pos at inverse frequency f. The angle in double, reduced mod 2 pi: fp32
// pos * f loses digits at long context (the CPU reference does the same).
__device__ __forceinline__ void rope_sincos(int64_t pos, float inv_freq, float& s, float& c) {
  const double angle = fmod(double(pos) * double(inv_freq), 6.283185307179586);
  sincosf(float(angle), &s, &c);
}

// The same sin / cos from a table filled by rope_table_fill (cos_sin[pos * half + i] = (c, s), the
// rope_sincos values, so cached and computed angles are the same bits); positions past the table
// are computed. The table turns a double-precision fmod and a sincos per (token, head, pair) into
// one 8-byte load that the heads of a token share through L1.
__device__ __forceinline__ void rope_sincos_cached(const float2* cos_sin, int64_t positions, int half, int64_t pos,
                                                   int i, const float* inv_freq, float& s, float& c) {
  if (pos < positions) {
    const float2 v = cos_sin[pos * half + i];
    c = v.x;
    s = v.y;
  } else {
    rope_sincos(pos, inv_freq[i], s, c);
  }
}

// The rotated pair: a' = x0 c - x1 s, b' = x0 s + x1 c.
__device__ __forceinline__ float rope_a(float x0, float x1, float s, float c) {
  return __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}
__device__ __forceinline__ float rope_b(float x0, float x1, float s, float c) {
  return __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// 8 bf16 (16 bytes) <-> 8 floats, for the 16-byte RoPE kernels (elementwise.cu, kv_quant_vec.cu).
__device__ __forceinline__ void bf16x8_to_float(const uint4& u, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
__device__ __forceinline__ uint4 float_to_bf16x8(const float* f) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return u;
}

// The 16-byte RoPE forms (rope_qkv's and rope_qkv_quant's) run from this many tokens; under it the
// per-token kernels, shaped for one token's latency, are the faster.
constexpr int64_t kRopeVecMinTokens = 64;

// Rotated 16-byte items of a token's heads: 8 elements each when interleaved, 8 pairs (16 elements)
// for halves.
__host__ __device__ constexpr int rope_vec_rot_items(int heads, int head_dim, bool interleaved) {
  return interleaved ? heads * head_dim / 8 : heads * head_dim / 16;
}

// One 16-byte RoPE item rotated with its (cos, sin) pairs already at hand: interleaved, the 8
// elements of a (pairs (a[0], a[1]) .. (a[6], a[7]), cs[0..3]) into oa; halves, pairs (a[p], b[p])
// with cs[p] into oa and ob. cs[i] = (cos, sin), rope_table_fill's order.
__device__ __forceinline__ void rope_rotate8(const float* a, const float* b, const float2* cs, bool interleaved,
                                             float* oa, float* ob) {
  if (interleaved) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      oa[2 * p] = rope_a(a[2 * p], a[2 * p + 1], cs[p].y, cs[p].x);
      oa[2 * p + 1] = rope_b(a[2 * p], a[2 * p + 1], cs[p].y, cs[p].x);
    }
  } else {
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      oa[p] = rope_a(a[p], b[p], cs[p].y, cs[p].x);
      ob[p] = rope_b(a[p], b[p], cs[p].y, cs[p].x);
    }
  }
}

// One 16-byte RoPE item of a head from its loaded values: ua holds elements d0 .. d0 + 7 and, for
// halves, ub elements half + d0 .. (unused when interleaved); interleaved, elements d0 .. d0 + 7
// rotated into oa; halves, pairs d0 .. d0 + 7 into oa and ob. rope_qkv_vec_kernel's and
// rope_qkv_quant_vec_kernel's arithmetic (and, through rope_rotate8, the qkv GEMM's RoPE
// epilogue's), per element the scalar kernels'.
__device__ __forceinline__ void rope_item_values(const uint4& ua, const uint4& ub, int d0, int half, bool interleaved,
                                                 int64_t pos, const float2* cos_sin, int64_t cos_sin_positions,
                                                 const float* inv_freq, float* oa, float* ob) {
  float a[8], b[8];
  float2 cs[8];
  bf16x8_to_float(ua, a);
  if (!interleaved) bf16x8_to_float(ub, b);
  const int pairs = interleaved ? 4 : 8, i0 = interleaved ? d0 / 2 : d0;
#pragma unroll
  for (int p = 0; p < 8; ++p)
    if (p < pairs) rope_sincos_cached(cos_sin, cos_sin_positions, half, pos, i0 + p, inv_freq, cs[p].y, cs[p].x);
  rope_rotate8(a, b, cs, interleaved, oa, ob);
}

// The same item read from global memory (src: the head's bf16 values).
__device__ __forceinline__ void rope_item(const bf16* src, int d0, int half, bool interleaved, int64_t pos,
                                          const float2* cos_sin, int64_t cos_sin_positions, const float* inv_freq,
                                          float* oa, float* ob) {
  const uint4 ua = *reinterpret_cast<const uint4*>(src + d0);
  const uint4 ub = interleaved ? ua : *reinterpret_cast<const uint4*>(src + half + d0);
  rope_item_values(ua, ub, d0, half, interleaved, pos, cos_sin, cos_sin_positions, inv_freq, oa, ob);
}

// --- SwiGLU ---

// silu(g) * u. The division is the fast one (__fdividef: a reciprocal and a multiply, ~2 ulp),
// not IEEE __fdiv_rn (a dozen instructions): in the fused gate/up GEMM's epilogue (session 9) the
// tensor cores wait for this math; with __fdiv_rn the fused kernel took 22.2 ms a pp2048 step
// against 21.15 ms with __fdividef (docs/performance/gemm.md). Every GPU SwiGLU (silu_mul, the
// fused GEMV and GEMM epilogues) calls this one function, so fused and unfused paths keep the same
// bits; the CPU reference computes exactly and the tests compare within bf16 tolerance. Where the
// denominator passes 2^126 (g below about -87.3) __fdividef returns 0 (or -0) instead of a value
// near 1e-37 * u: negligible after the bf16 rounding.
__device__ __forceinline__ float silu_mul_value(float g, float u) {
  return __fmul_rn(__fdividef(g, __fadd_rn(1.0f, __expf(-g))), u);
}

// A value as the bf16 the unfused path stores between kernels, back in fp32.
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

}  // namespace kiln::cuda
