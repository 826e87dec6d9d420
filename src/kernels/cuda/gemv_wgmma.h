// Internal to gemv.cu: the sm_90a TMA + wgmma decode GEMVs of gemv_wgmma.cu, gemv versions 5 and 6 (lab).
#pragma once

#include "kernels/cuda/common.h"

namespace kiln::cuda {

// Launches y = x . W^T (+ bias) per OutMode for 1 <= M <= 16 and returns true; returns false and
// launches nothing where it cannot run (not an sm_90a device or binary, K % 8 != 0, x or W not
// 16-byte aligned), so the caller can fall back.
bool gemv_wgmma(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                int64_t N, int64_t K, cudaStream_t stream);

// Version 6: the same tiles in a persistent grid (one block per SM, a 12-stage ring, K splits
// reduced by the last unit of a tile to arrive). Same contract and fallback as gemv_wgmma.
bool gemv_wgmma_persistent(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                           int64_t K, cudaStream_t stream);

}  // namespace kiln::cuda
