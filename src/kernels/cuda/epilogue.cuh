// Device-side store of one result element per OutMode (shared by gemv.cu and gemm.cu).
#pragma once

#include "kernels/cuda/common.h"

namespace kiln::cuda {

__device__ __forceinline__ void store_out(void* y, OutMode mode, int64_t idx, float v) {
  if (mode == OutMode::store_bf16)
    static_cast<bf16*>(y)[idx] = __float2bfloat16(v);
  else if (mode == OutMode::store_f32)
    static_cast<float*>(y)[idx] = v;
  else
    static_cast<float*>(y)[idx] += v;
}

// Two adjacent results (idx, idx + 1) with one 4- or 8-byte access; idx must be even.
__device__ __forceinline__ void store_out2(void* y, OutMode mode, int64_t idx, float v0, float v1) {
  if (mode == OutMode::store_bf16) {
    reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(y) + idx)[0] = __floats2bfloat162_rn(v0, v1);
  } else {
    float2* p = reinterpret_cast<float2*>(static_cast<float*>(y) + idx);
    if (mode == OutMode::store_f32) {
      *p = make_float2(v0, v1);
    } else {
      float2 o = *p;
      *p = make_float2(o.x + v0, o.y + v1);
    }
  }
}

__device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

// Stores one warpgroup's (64, BN) accumulator block whose first row is row0 (+ bias, per mode).
// d[4j + e] is (row 16w + l/4 + 8(e>>1), col 8j + 2(l%4) + (e&1)), w = warp, l = lane (gemm_wgmma.cu); the
// register epilogue of the wgmma GEMMs (gemm_wgmma.cu, gemm_wgmma_persistent.cu).
template <int BN>
__device__ __forceinline__ void store_acc_block(const float* d, int tid, int64_t row0, int64_t n0, const bf16* bias,
                                                void* y, OutMode mode, int64_t M, int64_t N) {
  const int w = tid / 32, l = tid % 32;
  const int64_t r_base = row0 + w * 16 + l / 4;
  const bool pairs = (N & 1) == 0;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int64_t col = n0 + j * 8 + 2 * (l % 4);
    if (col >= N) continue;
    const bool has_c1 = col + 1 < N;
    const float b0 = bias ? __bfloat162float(bias[col]) : 0.0f;
    const float b1 = bias && has_c1 ? __bfloat162float(bias[col + 1]) : 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = r_base + 8 * h;
      if (r >= M) continue;
      const float v0 = d[4 * j + 2 * h] + b0, v1 = d[4 * j + 2 * h + 1] + b1;
      if (pairs && has_c1) {
        store_out2(y, mode, r * N + col, v0, v1);
      } else {
        store_out(y, mode, r * N + col, v0);
        if (has_c1) store_out(y, mode, r * N + col + 1, v1);
      }
    }
  }
}

// bf16x2 -> two floats; 8 bf16 in a uint4 -> 8 floats.
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

}  // namespace kiln::cuda
