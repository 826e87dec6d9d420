// The CUDA/cuBLAS error idiom: KILN_CUDA_CHECK(expr) and KILN_CUBLAS_CHECK(expr) turn a failed
// call into kiln::Error(Errc::cuda) naming the expression, the error, the file and the line.
// KILN_CUDA_CHECK_LAUNCH() checks the last kernel launch (bad grid, missing image for this GPU).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

// No fmt here: nvcc cannot compile fmt's header-only mode, so .cu files use these macros only.
namespace kiln::cuda {
[[noreturn]] void fail_invalid(const char* what, const char* file, int line);
[[noreturn]] void fail_cuda(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t st, const char* expr, const char* file, int line);
}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(expr)                                                          \
  do {                                                                                 \
    cudaError_t kiln_err_ = (expr);                                                    \
    if (kiln_err_ != cudaSuccess) [[unlikely]]                                         \
      ::kiln::cuda::fail_cuda(kiln_err_, #expr, __FILE__, __LINE__);                   \
  } while (0)

#define KILN_CUBLAS_CHECK(expr)                                                        \
  do {                                                                                 \
    cublasStatus_t kiln_st_ = (expr);                                                  \
    if (kiln_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                \
      ::kiln::cuda::fail_cublas(kiln_st_, #expr, __FILE__, __LINE__);                  \
  } while (0)

// Argument validation in launchers (.cu files): kiln::Error(Errc::invalid_argument).
#define KILN_CUDA_REQUIRE(cond, what)                                                  \
  do {                                                                                 \
    if (!(cond)) [[unlikely]]                                                          \
      ::kiln::cuda::fail_invalid(what, __FILE__, __LINE__);                            \
  } while (0)

#define KILN_CUDA_CHECK_LAUNCH() KILN_CUDA_CHECK(cudaGetLastError())
