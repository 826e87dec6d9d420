#include "backend/cuda/cublas_ref.h"

#include <cublas_v2.h>

#include "backend/cuda/cuda_check.h"

namespace kiln::cuda {

CublasGemm::CublasGemm() {
  cublasHandle_t h = nullptr;
  KILN_CUBLAS_CHECK(cublasCreate(&h));
  handle_ = h;
}

CublasGemm::~CublasGemm() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

void CublasGemm::gemm_bf16(const bf16* x, const bf16* w, bf16* y, int64_t M, int64_t N, int64_t K,
                           cudaStream_t stream) {
  auto h = static_cast<cublasHandle_t>(handle_);
  KILN_CUBLAS_CHECK(cublasSetStream(h, stream));
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: y^T (N, M) = W (K, N)^T . x^T (K, M).
  KILN_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w, CUDA_R_16BF, int(K),
                                 x, CUDA_R_16BF, int(K), &beta, y, CUDA_R_16BF, int(N), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

}  // namespace kiln::cuda
