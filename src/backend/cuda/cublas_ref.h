// cuBLAS as the baseline (and fallback) of the matrix kernels: y(M, N) = x(M, K) . W(N, K)^T in
// bf16 with fp32 accumulation, the same contract as kernels/cuda/matmul.h (store_bf16 mode).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.h"

namespace kiln::cuda {

class CublasGemm {
 public:
  CublasGemm();
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;
  void gemm_bf16(const bf16* x, const bf16* w, bf16* y, int64_t M, int64_t N, int64_t K, cudaStream_t stream);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
};

}  // namespace kiln::cuda
