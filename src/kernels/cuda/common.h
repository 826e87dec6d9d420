// Shared by every kernel launcher header: the bf16 type, the output modes of matrix products,
// and KILN_HD for helpers used on both host and device. Host C++ may include this (no kernels).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif

namespace kiln::cuda {

using bf16 = __nv_bfloat16;

// How a matrix product writes y(M, N):
//   store_bf16: y is bf16, y = acc (+ bias)           -- projections feeding the next kernel
//   store_f32:  y is fp32, y = acc (+ bias)           -- logits
//   add_f32:    y is fp32, y += acc (+ bias)          -- o/down projections add into the fp32
//                                                        residual stream (the fused residual add)
enum class OutMode : int { store_bf16 = 0, store_f32 = 1, add_f32 = 2 };

}  // namespace kiln::cuda
