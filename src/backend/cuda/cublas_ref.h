// cuBLAS as the baseline (and fallback) of the matrix kernels: y(M, N) = x(M, K) . W(N, K)^T in
// bf16 with fp32 accumulation, the same contract as kernels/cuda/matmul.h (store_bf16 mode).
#pragma once

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <map>

#include "kernels/cuda/common.h"

namespace kiln::cuda {

class CublasGemm {
 public:
  CublasGemm();
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;
  void gemm_bf16(const bf16* x, const bf16* w, bf16* y, int64_t M, int64_t N, int64_t K, cudaStream_t stream);
  // The fp8 baseline (cuBLASLt, e4m3 x (M, K) and W (N, K), bf16 y, fp32 accumulation): what the
  // fp8 GEMM is measured against. With xs and ws (one fp32 scale per x row and per W row, kiln's
  // W8A8 scales) it asks cuBLASLt's outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
  // y = (x . W^T) * xs[m] * ws[n]: the same epilogue work as kiln's); without them, no scaling.
  // Returns false (nothing launched) when cuBLASLt has no kernel for it on this device.
  bool gemm_fp8(const uint8_t* xq, const uint8_t* w, bf16* y, int64_t M, int64_t N, int64_t K, cudaStream_t stream,
                const float* xs = nullptr, const float* ws = nullptr);

 private:
  void* handle_ = nullptr;     // cublasHandle_t
  void* lt_handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;  // device memory for cuBLASLt's split-K and the like
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
  // (M, N, K, scaled) -> the heuristic's pick
  std::map<std::array<int64_t, 4>, cublasLtMatmulAlgo_t> fp8_algos_;
};

}  // namespace kiln::cuda
