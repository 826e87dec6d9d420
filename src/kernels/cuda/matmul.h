// Matrix products of the forward pass: y(M, N) = x(M, K) . W(N, K)^T (+ bias(N)), bf16 x and W
// (row-major, K contiguous: the layout of every weight), fp32 accumulation, written per OutMode.
//   gemv: decode batches, M <= 16: memory-bound, streams W once with 16-byte loads straight into
//         mma.sync fragments (W read once for all M rows; see gemv.cu).
//   gemm: prefill, any M: tensor cores (mma.sync m16n8k16, ldmatrix, cp.async pipeline; gemm.cu).
//   matmul: picks one by M. Both need no alignment beyond that of cudaMalloc rows; K % 8 != 0
//   takes a slow scalar path (no model has such a K; tests cover it).
#pragma once

#include "kernels/cuda/common.h"

namespace kiln::cuda {

constexpr int kGemvMaxRows = 16;

void gemv(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
          cudaStream_t stream);
void gemm(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
          cudaStream_t stream);
// Kernel-lab hooks: run one version (1 .. *_versions(), the v1, v2, ... of the .cu file headers)
// instead of the default choice (version 0 = what gemv / gemm run).
int gemv_versions();
void gemv_version(int version, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream);
int gemm_versions();
void gemm_version(int version, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream);
inline void matmul(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                   int64_t K, cudaStream_t stream) {
  if (M <= kGemvMaxRows)
    gemv(x, w, bias, y, mode, M, N, K, stream);
  else
    gemm(x, w, bias, y, mode, M, N, K, stream);
}

}  // namespace kiln::cuda
