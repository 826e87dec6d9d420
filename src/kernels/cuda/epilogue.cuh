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
