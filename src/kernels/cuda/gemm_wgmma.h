// Internal to gemm.cu (and the tests): the sm_90a wgmma + TMA GEMM of gemm_wgmma.cu, gemm version 4.
#pragma once

#include "kernels/cuda/common.h"

namespace kiln::cuda {

// True when the current device is compute capability 9.0 and this binary holds the sm_90a kernel.
bool gemm_wgmma_available();
// Launches y = x . W^T (+ bias) per OutMode and returns true; returns false and launches nothing when
// the kernel cannot run it (not available, K % 8 != 0, x or W not 16-byte aligned), so the caller
// can fall back.
bool gemm_wgmma(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                int64_t K, cudaStream_t stream);

// Split-K partial pass (gemm.cu's gemm_splitk): `splits` slices of k_steps_per_split 64-wide K steps
// (128x128 tiles, grid z = slice); slice z writes its fp32 partial x . W^T over its K range, without
// bias, to partials + z * M * N. Returns false and launches nothing when it cannot run (as gemm_wgmma,
// or a slice would be empty).
bool gemm_wgmma_splitk(const bf16* x, const bf16* w, float* partials, int64_t M, int64_t N, int64_t K, int splits,
                       int k_steps_per_split, cudaStream_t stream);
// The current device's SM count when gemm_wgmma_available(), else 0.
int gemm_wgmma_sms();

}  // namespace kiln::cuda
