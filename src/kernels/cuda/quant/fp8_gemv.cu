// Decode GEMV with fp8 weights and fp8 activations (W8A8), 1 <= M <= 16:
//   y[m, n] = scale_x[m] * scale_w[n] * sum_k e4m3(xq[m, k]) * e4m3(wq[n, k])  (+ bias[n]).
// xq / scale_x come from fp8_quantize_rows. Every e4m3 value is exactly an f16 value and a product
// of two fits fp32 exactly, so converting both operands to f16 (cvt.rn.f16x2.e4m3x2, two values per
// instruction) and running f16 mma.sync with fp32 accumulation computes the CPU reference's products
// exactly; only the fp32 summation order differs.
//
// Structure: gemv.cu's v2 with 16-byte pieces of 16 e4m3 values: lane (g, t) loads chunk
// c = 4u + t (+ step) of rows g and g + 8 (weights row-major as given, no repacking) and the same
// 16 bytes of its activation row; word j of a chunk feeds one MMA (a0/a2 from its two halves of
// row g, a1/a3 of row g + 8, b0/b1 from the activation word), i.e. 4 MMAs per 16-byte piece and
// 24 conversions per lane per chunk (16 weight values x 2 rows + 16 activation values).
// Prediction: as int8 (1 byte a weight): ~85% of copy on the large shapes if the conversions
// (~0.75 per weight byte) keep up; if not, the conversion pipe is the limit (ncu: pipe utilization).
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemv_reduce.cuh"
#include "kernels/cuda/mma_frag.cuh"
#include "kernels/cuda/quant/qmatmul.h"

namespace kiln::cuda {
namespace {

using namespace qk;

template <int NT, int U, int W>
__global__ void __launch_bounds__(W * 32, 16 / W)
    fp8_gemv_kernel(const uint8_t* __restrict__ xq, const float* __restrict__ xs, const uint8_t* __restrict__ wq,
                    const float* __restrict__ ws, const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode,
                    int m_actual, int64_t N, int64_t K) {
  __shared__ float red[W][16][8 * NT + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t n_chunks = K / 16;
  const uint4* w_lo = reinterpret_cast<const uint4*>(wq + imin64(row0 + g, N - 1) * K);
  const uint4* w_hi = reinterpret_cast<const uint4*>(wq + imin64(row0 + g + 8, N - 1) * K);
  const uint4* xr[NT];
  bool x_ok[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    x_ok[n] = 8 * n + g < m_actual;
    xr[n] = reinterpret_cast<const uint4*>(xq + (x_ok[n] ? int64_t(8 * n + g) * K : 0));
  }
  // Two accumulator chains (by word parity): halves the dependent MMA sequence of a step.
  float acc[2][NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][n][e] = acc[1][n][e] = 0.0f;

  constexpr int kStep = 4 * U;
  for (int64_t step = int64_t(warp) * kStep; step < n_chunks; step += int64_t(W) * kStep) {
    const int64_t base = step + t;
    uint4 a_lo[U], a_hi[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + 4 * u;
      if (c < n_chunks) {
        a_lo[u] = ld_weight(w_lo + c);
        a_hi[u] = ld_weight(w_hi + c);
      } else {
        a_lo[u] = a_hi[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + 4 * u;
      uint4 b[NT];
#pragma unroll
      for (int n = 0; n < NT; ++n) b[n] = (x_ok[n] && c < n_chunks) ? __ldg(xr[n] + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t wl = word(a_lo[u], j), wh = word(a_hi[u], j);
        const uint32_t a0 = e4m3x2_to_f16x2(wl & 0xFFFFu), a2 = e4m3x2_to_f16x2(wl >> 16);
        const uint32_t a1 = e4m3x2_to_f16x2(wh & 0xFFFFu), a3 = e4m3x2_to_f16x2(wh >> 16);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint32_t xw = word(b[n], j);
          mma_f16(acc[j & 1][n], a0, a1, a2, a3, e4m3x2_to_f16x2(xw & 0xFFFFu), e4m3x2_to_f16x2(xw >> 16));
        }
      }
    }
  }

#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp][g + 8 * (e >> 1)][8 * n + 2 * t + (e & 1)] = acc[0][n][e] + acc[1][n][e];
  gemv_meet<W, NT>(
      red, row0, m_actual, N, [](int64_t) { return 0.0f; },
      [&](int m, int64_t n, float v) {
        store_out(y, mode, int64_t(m) * N + n, v * xs[m] * ws[n] + (bias ? __bfloat162float(bias[n]) : 0.0f));
      });
}

template <int NT>
void launch(const uint8_t* xq, const float* xs, const QWeight& w, const bf16* bias, void* y, OutMode mode, int m,
            cudaStream_t stream) {
  const int64_t blocks = (w.rows + 15) / 16;
  constexpr int U = NT == 1 ? 8 : 6;
  const auto* q = static_cast<const uint8_t*>(w.data);
  if (blocks <= 2 * int64_t(device_sm_count()))
    fp8_gemv_kernel<NT, U, 8><<<unsigned(blocks), 8 * 32, 0, stream>>>(xq, xs, q, w.scales, bias, y, mode, m, w.rows,
                                                                       w.cols);
  else
    fp8_gemv_kernel<NT, U, 4><<<unsigned(blocks), 4 * 32, 0, stream>>>(xq, xs, q, w.scales, bias, y, mode, m, w.rows,
                                                                       w.cols);
}

}  // namespace

void fp8_gemv(const uint8_t* xq, const float* xs, const QWeight& w, const bf16* bias, void* y, OutMode mode, int64_t M,
              cudaStream_t stream) {
  KILN_CUDA_REQUIRE(M >= 1 && M <= kGemvMaxRows, "fp8_gemv takes 1..16 rows");
  KILN_CUDA_REQUIRE(w.format == QuantFormat::fp8 && w.cols % 16 == 0, "fp8_gemv: fp8 weights with K % 16 == 0");
  if (w.rows == 0) return;
  if (M <= 8)
    launch<1>(xq, xs, w, bias, y, mode, int(M), stream);
  else
    launch<2>(xq, xs, w, bias, y, mode, int(M), stream);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
