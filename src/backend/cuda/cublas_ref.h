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
  // fp8 GEMM is measured against. cuBLASLt on Hopper takes per-tensor scales only, so none are
  // applied here (kiln's per-row scales cost its epilogue two loads and two multiplies a value).
  // Returns false when cuBLASLt has no fp8 kernel for it on this device.
  bool gemm_fp8(const uint8_t* xq, const uint8_t* w, bf16* y, int64_t M, int64_t N, int64_t K, cudaStream_t stream);

 private:
  void* handle_ = nullptr;     // cublasHandle_t
  void* lt_handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;  // device memory for cuBLASLt's split-K and the like
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
  std::map<std::array<int64_t, 3>, cublasLtMatmulAlgo_t> fp8_algos_;  // (M, N, K) -> the heuristic's pick
};

}  // namespace kiln::cuda
