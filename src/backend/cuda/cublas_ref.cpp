#include "backend/cuda/cublas_ref.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace kiln::cuda {

CublasGemm::CublasGemm() {
  cublasHandle_t h = nullptr;
  KILN_CUBLAS_CHECK(cublasCreate(&h));
  handle_ = h;
}

CublasGemm::~CublasGemm() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (lt_handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_handle_));
  if (workspace_) cudaFree(workspace_);
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

bool CublasGemm::gemm_fp8(const uint8_t* xq, const uint8_t* w, bf16* y, int64_t M, int64_t N, int64_t K,
                          cudaStream_t stream, const float* xs, const float* ws) {
  if (!workspace_) KILN_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  if (!lt_handle_) {
    cublasLtHandle_t lt = nullptr;
    KILN_CUBLAS_CHECK(cublasLtCreate(&lt));
    lt_handle_ = lt;
  }
  auto lt = static_cast<cublasLtHandle_t>(lt_handle_);
  const bool scaled = xs && ws;
  // Column-major, as gemm_bf16: y^T (N, M) = W (K, N)^T . x^T (K, M); fp8 needs this "TN" form. So
  // cuBLASLt's A is W (its outer vector: N scales, ws) and its B is x (M scales, xs).
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  auto ok_status = [](cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; };
  bool ok = ok_status(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
            ok_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans))) &&
            ok_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)));
  if (ok && scaled)
    ok = ok_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer))) &&
         ok_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer))) &&
         ok_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof(ws))) &&
         ok_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof(xs)));
  ok = ok && ok_status(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), K)) &&
       ok_status(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(M), K)) &&
       ok_status(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, uint64_t(N), uint64_t(M), N)) &&
       ok_status(cublasLtMatmulPreferenceCreate(&pref)) &&
       ok_status(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes,
                                                      sizeof(kWorkspaceBytes)));
  // The heuristic's pick, once per shape (the query costs host time that back-to-back timing would see).
  auto it = fp8_algos_.find({M, N, K, scaled ? 1 : 0});
  if (ok && it == fp8_algos_.end()) {
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    ok = ok_status(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heuristic, &found)) && found > 0;
    if (ok) it = fp8_algos_.emplace(std::array<int64_t, 4>{M, N, K, scaled ? 1 : 0}, heuristic.algo).first;
  }
  const float alpha = 1.0f, beta = 0.0f;
  ok = ok && ok_status(cublasLtMatmul(lt, op, &alpha, w, la, xq, lb, &beta, y, lc, y, lc, &it->second, workspace_,
                                      kWorkspaceBytes, stream));
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return ok;
}

}  // namespace kiln::cuda
