// RMSNorm of one fp32 row as rmsnorm_kernel (elementwise.cu) computes it, bit for bit, for kernels
// that fold the norm into their prologue instead of reading rmsnorm's bf16 output (the int8 / int4
// fused decode GEMVs: quant/qgemv_v3.cu). rmsnorm_kernel runs one block of rmsnorm_threads(dim)
// threads a row; thread j sums the squares of float4s j, j + T, ... in order, each warp reduces
// with an xor butterfly, and one more butterfly sums the warp partials. rms_scale_replayed runs
// the same tree on any block: its warps take the kernel's virtual warps in turn, lane l playing
// thread 32 vw + l. Every lane of an xor butterfly ends with the same bits (a + b == b + a).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {

// rmsnorm_kernel's block size for a row of dim values (a multiple of 32, <= 1024).
__host__ __device__ constexpr int rmsnorm_threads(int64_t dim) { return dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 128; }

// One float4 of a row the kernel before this one wrote (after pdl_wait; not the read-only path).
__device__ __forceinline__ float4 ld_f4_after_wait(const float* p) {
  const uint4 u = ld_after_wait(p);
  return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
}

__device__ __forceinline__ float warp_xor_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// rsqrt(mean(x^2) + eps) of x (dim floats, dim % 4 == 0, 16-byte aligned) with rmsnorm_kernel's
// bits. Every thread of the block calls it (one __syncthreads inside); partials: 32 floats of
// shared memory, which the caller may reuse only after its next __syncthreads (all lanes read it).
__device__ __forceinline__ float rms_scale_replayed(const float* x, int64_t dim, float eps, float* partials) {
  const int T = rmsnorm_threads(dim), warps = int(blockDim.x / 32);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int n4 = int(dim / 4), vws = T / 32;
  // A warp plays up to kBatch of the kernel's warps at once, their loads issued together (one L2
  // round trip per batch, not per virtual warp: the first version, one at a time, cost the fused
  // GEMV ~6 us a call).
  constexpr int kBatch = 8;
  for (int vw0 = warp; vw0 < vws; vw0 += warps * kBatch) {
    float ss[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) ss[j] = 0.0f;
    for (int r = 0; r * T < n4; ++r) {  // the kernel's loop over i = j, j + T, ... in order
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int vw = vw0 + j * warps, i = vw * 32 + lane + r * T;
        v[j] = vw < vws && i < n4 ? ld_f4_after_wait(x + 4 * int64_t(i)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) ss[j] += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int vw = vw0 + j * warps;
      const float total = warp_xor_sum(ss[j]);
      if (lane == 0 && vw < vws) partials[vw] = total;
    }
  }
  __syncthreads();
  const float total = warp_xor_sum(lane < vws ? partials[lane] : 0.0f);
  return rsqrtf(total / float(dim) + eps);
}

// Eight normalized values x[k .. k + 7] * scale * w[k ..], rounded to bf16 as rmsnorm_kernel
// rounds them, packed as one 16-byte piece (k % 8 == 0).
__device__ __forceinline__ uint4 rms_normalized_piece(const float* x, const bf16* w, int64_t k, float scale) {
  const float4 a = ld_f4_after_wait(x + k), b = ld_f4_after_wait(x + k + 4);
  const uint4 wv = __ldg(reinterpret_cast<const uint4*>(w + k));
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  const uint32_t wp[4] = {wv.x, wv.y, wv.z, wv.w};
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 wf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wp[i]));
    __nv_bfloat162 p = __floats2bfloat162_rn(v[2 * i] * scale * wf.x, v[2 * i + 1] * scale * wf.y);
    r[i] = *reinterpret_cast<uint32_t*>(&p);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

}  // namespace kiln::cuda
