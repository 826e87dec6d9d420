// qmatmul: the dispatch of qmatmul.h (format x M -> kernel).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
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
      fp8_quantize_rows(x, M, K, scratch.xq, scratch.xs, stream);
      if (M > kGemvMaxRows && fp8_gemm(scratch.xq, scratch.xs, w, bias, y, mode, M, stream)) return;
      by_slices(M, N, y, mode, [&](int64_t m0, int64_t m, void* ys) {
        fp8_gemv(scratch.xq + m0 * K, scratch.xs + m0, w, bias, ys, mode, m, stream);
      });
      return;
    }
  }
}

}  // namespace kiln::cuda
