// qmatmul: the dispatch of qmatmul.h (format x M -> kernel).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/quant/qmatmul.h"

namespace kiln::cuda {
namespace {

size_t out_elem_bytes(OutMode mode) { return mode == OutMode::store_bf16 ? 2 : 4; }

// Row slices of at most 16 through a GEMV-shaped kernel: x advances by K per row, y by N.
template <class F>
void by_slices(int64_t M, int64_t N, void* y, OutMode mode, F&& run) {
  for (int64_t m0 = 0; m0 < M; m0 += kGemvMaxRows) {
    const int64_t m = std::min<int64_t>(kGemvMaxRows, M - m0);
    run(m0, m, static_cast<char*>(y) + size_t(m0 * N) * out_elem_bytes(mode));
  }
}

}  // namespace

void qmatmul(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int64_t M, cudaStream_t stream,
             MatmulWorkspace ws, const QScratch& scratch) {
  const int64_t N = w.rows, K = w.cols;
  if (M <= 0 || N == 0) return;
  switch (w.format) {
    case QuantFormat::none:
      matmul(x, static_cast<const bf16*>(w.data), bias, y, mode, M, N, K, stream, ws);
      return;
    case QuantFormat::int8:
    case QuantFormat::int4:
      if (M <= kQGemvSliceRows || !scratch.w) {
        by_slices(M, N, y, mode, [&](int64_t m0, int64_t m, void* ys) { qgemv(x + m0 * K, w, bias, ys, mode, m, stream); });
      } else {
        KILN_CUDA_REQUIRE(scratch.w_elems >= N * K, "qmatmul: dequantization scratch too small");
        // M > kQGemvSliceRows: matmul takes a GEMM here. A decode GEMV must never read this scratch:
        // it loads its weights before its PDL wait, i.e. possibly before this dequantization ends.
        dequantize_to_bf16(w, scratch.w, stream);
        matmul(x, scratch.w, bias, y, mode, M, N, K, stream, ws);
      }
      return;
    case QuantFormat::fp8: {
      KILN_CUDA_REQUIRE(scratch.xq && scratch.xq_bytes >= M * K && scratch.xs_rows >= M,
                        "qmatmul: fp8 needs an activation scratch of M * K bytes and M scales");
      if (!scratch.xq_ready) fp8_quantize_rows(x, M, K, scratch.xq, scratch.xs, stream);
      if (M > kGemvMaxRows && fp8_gemm(scratch.xq, scratch.xs, w, bias, y, mode, M, stream)) return;
      by_slices(M, N, y, mode, [&](int64_t m0, int64_t m, void* ys) {
        fp8_gemv(scratch.xq + m0 * K, scratch.xs + m0, w, bias, ys, mode, m, stream);
      });
      return;
    }
  }
}

bool fp8_gemm_swiglu_can_run(const bf16* x, const QWeight& w, const bf16* h, int64_t M, int64_t inter,
                             const QScratch& scratch) {
  // The switches of the unfused pair it replaces: KILN_GEMM_SWIGLU=0 (as for bf16) and
  // KILN_FP8_PERSISTENT=0 (the one-tile-per-block fp8 GEMM, which has no fused form).
  static const bool on = env_switch_on("KILN_GEMM_SWIGLU") && env_switch_on("KILN_FP8_PERSISTENT");
  const int64_t K = w.cols;
  if (!on || w.format != QuantFormat::fp8 || w.rows != 2 * inter || M < kFp8PersistentMinRows || (!x && !scratch.xq_ready))
    return false;
  if (!scratch.xq || scratch.xq_bytes < M * K || scratch.xs_rows < M) return false;
  return gemm_wgmma_fp8_swiglu_can_run(scratch.xq, static_cast<const uint8_t*>(w.data), h, M, inter, K);
}

bool fp8_gemm_swiglu(const bf16* x, const QWeight& w, bf16* h, int64_t M, int64_t inter, cudaStream_t stream,
                     const QScratch& scratch) {
  if (!fp8_gemm_swiglu_can_run(x, w, h, M, inter, scratch)) return false;
  if (!scratch.xq_ready) fp8_quantize_rows(x, M, w.cols, scratch.xq, scratch.xs, stream);
  return gemm_wgmma_fp8_swiglu(scratch.xq, scratch.xs, static_cast<const uint8_t*>(w.data), w.scales, h, M, inter,
                               w.cols, stream);
}

}  // namespace kiln::cuda
