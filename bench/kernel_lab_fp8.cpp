// kernel_lab --fp8-gemm: the fp8 (W8A8) prefill GEMMs on each projection shape at each M, next to
// the same run's baselines: cuBLASLt fp8 (e4m3 x e4m3 -> bf16, its heuristic's pick; without
// scales, and with kiln's per-row scales through its outer-vector scaling where this cuBLASLt has
// it: cublas-fp8-rowscale), cuBLAS bf16 and kiln's bf16 GEMM. kiln's rows: fp8-v1 (fp8_gemm_wgmma.cu: one 128 x BN tile per
// block, register epilogue), fp8-v2 (the persistent kernel's fp8 configurations: TMA-store /
// reduce-add epilogues), the residual-add form on o / down (-add), SwiGLU fused into gate/up
// (fp8-swiglu, against fp8-v2+silu: the GEMM then silu_mul), and the per-token activation
// quantization each product needs in front (quant). Validated first: v2 against v1 (the same fp8
// sums, bf16-rounded), cuBLASLt against v2 run with unit scales, and with the row scales against v2.
#include <cstdio>
#include <vector>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "kernels/cuda/random_fill.h"
#include "kernel_lab.h"

namespace kiln::lab {

using cuda::OutMode;
using cuda::QWeight;

namespace {

void check(const char* what, const std::string& shape, const std::vector<float>& got, const std::vector<float>& ref,
           double tol) {
  const double err = rel_error(got, ref);
  if (!(err < tol)) std::printf("VALIDATION FAILED: %s %s err %.3e\n", what, shape.c_str(), err);
}

}  // namespace

void bench_fp8_gemm(double copy_gbs, cuda::CublasGemm& cublas, const std::vector<MatShape>& shapes,
                    const std::vector<int64_t>& ms) {
  if (!cuda::fp8_gemm_available()) {
    std::printf("fp8 GEMM: not available on this device (needs sm_90a)\n");
    return;
  }
  const int64_t mmax = *std::max_element(ms.begin(), ms.end());
  for (const MatShape& s : shapes) {
    const bool residual = std::string(s.name) == "o" || std::string(s.name) == "down";
    const bool gate_up = std::string(s.name) == "gate_up";
    // Rotating fp8 copies of W (> 4x the L2 in all), one bf16 W for the bf16 baselines (M >= 512 is
    // compute-bound: where W sits does not change its time).
    const int copies = int(std::max<int64_t>(1, kRotateBytes / (s.n * s.k) + 1));
    std::vector<DeviceBuffer<uint8_t>> wq;
    std::vector<DeviceBuffer<float>> wscale;
    std::vector<QWeight> views;
    for (int i = 0; i < copies; ++i) {
      wq.emplace_back(size_t(s.n * s.k));
      wscale.emplace_back(size_t(s.n));
      cuda::fill_random_qweight(QuantFormat::fp8, s.n, s.k, s.k, wq.back().data(), wscale.back().data(), 11,
                                uint64_t(i), 0.05f, nullptr);
      views.push_back({QuantFormat::fp8, s.n, s.k, s.k, wq.back().data(), wscale.back().data()});
    }
    DeviceBuffer<bf16> wb(size_t(s.n * s.k)), x(size_t(mmax * s.k)), y(size_t(mmax * s.n)), yref(size_t(mmax * s.n));
    DeviceBuffer<bf16> h(gate_up ? size_t(mmax * s.n / 2) : 0);
    DeviceBuffer<float> yf(residual ? size_t(mmax * s.n) : 0);
    DeviceBuffer<uint8_t> xq(size_t(mmax * s.k));
    DeviceBuffer<float> xs{size_t(mmax)}, ones{size_t(std::max(mmax, s.n))};
    cuda::fill_random_bf16(wb.data(), s.n * s.k, 1, 0, 0, 0.05f, nullptr);
    cuda::fill_random_bf16(x.data(), mmax * s.k, 2, 0, 0, 1.0f, nullptr);
    ones.upload(std::vector<float>(ones.size(), 1.0f));
    yf.zero();
    for (int64_t m : ms) {
      const std::string shape = shape_name(s, m);
      const double flops = 2.0 * double(m) * double(s.n) * double(s.k);
      const double bytes8 = double(s.n * s.k) + double(m * s.k) + 2.0 * double(m * s.n);  // fp8 in, bf16 out
      const double bytes16 = 2.0 * double(s.n * s.k) + 2.0 * double(m * s.k) + 2.0 * double(m * s.n);
      cuda::fp8_quantize_rows(x.data(), m, s.k, xq.data(), xs.data(), nullptr);
      auto fp8 = [&](int version, int i, void* out, OutMode mode) {
        if (!cuda::fp8_gemm(xq.data(), xs.data(), views[size_t(i % copies)], nullptr, out, mode, m, nullptr, version))
          throw std::runtime_error("fp8_gemm refused a lab shape");
      };
      // Validation: v2 against v1; cuBLASLt (no scales) against v2 with unit scales.
      fp8(1, 0, yref.data(), OutMode::store_bf16);
      fp8(2, 0, y.data(), OutMode::store_bf16);
      cuda::cuda_synchronize();
      std::vector<float> v2 = to_float(y), v1 = to_float(yref);
      v2.resize(size_t(m * s.n));
      v1.resize(v2.size());
      check("fp8-v2 vs fp8-v1", shape, v2, v1, 1e-2);
      const QWeight unit{QuantFormat::fp8, s.n, s.k, s.k, wq[0].data(), ones.data()};
      const bool have_lt = cublas.gemm_fp8(xq.data(), wq[0].data(), yref.data(), m, s.n, s.k, nullptr);
      if (have_lt) {
        if (!cuda::fp8_gemm(xq.data(), ones.data(), unit, nullptr, y.data(), OutMode::store_bf16, m, nullptr, 2))
          throw std::runtime_error("fp8_gemm refused a lab shape");
        cuda::cuda_synchronize();
        std::vector<float> a = to_float(y), b = to_float(yref);
        a.resize(size_t(m * s.n));
        b.resize(a.size());
        check("cublas-fp8 vs fp8-v2 (unit scales)", shape, b, a, 1e-2);
      } else {
        std::printf("cuBLASLt: no fp8 kernel for %s\n", shape.c_str());
      }
      const bool have_lt_scaled =
          cublas.gemm_fp8(xq.data(), wq[0].data(), yref.data(), m, s.n, s.k, nullptr, xs.data(), wscale[0].data());
      if (have_lt_scaled) {
        cuda::cuda_synchronize();
        std::vector<float> b = to_float(yref);
        b.resize(v2.size());
        check("cublas-fp8-rowscale vs fp8-v2", shape, b, v2, 1e-2);
      } else {
        std::printf("cuBLASLt: no fp8 kernel with outer-vector scales for %s\n", shape.c_str());
      }

      double t = time_ms([&](int) { cuda::matmul(x.data(), wb.data(), nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k, nullptr); }, 10, 2);
      record("fp8gemm", shape, "bf16", t, bytes16, flops, copy_gbs, 0);
      t = time_ms([&](int) { cublas.gemm_bf16(x.data(), wb.data(), yref.data(), m, s.n, s.k, nullptr); }, 10, 2);
      record("fp8gemm", shape, "cublas", t, bytes16, flops, copy_gbs, 0);
      if (have_lt) {
        t = time_ms([&](int i) { cublas.gemm_fp8(xq.data(), wq[size_t(i % copies)].data(), yref.data(), m, s.n, s.k, nullptr); }, 10, 2);
        record("fp8gemm", shape, "cublas-fp8", t, bytes8, flops, copy_gbs, 0);
      }
      if (have_lt_scaled) {
        t = time_ms([&](int i) {
          cublas.gemm_fp8(xq.data(), wq[size_t(i % copies)].data(), yref.data(), m, s.n, s.k, nullptr, xs.data(),
                          wscale[size_t(i % copies)].data());
        }, 10, 2);
        record("fp8gemm", shape, "cublas-fp8-rowscale", t, bytes8, flops, copy_gbs, 0);
      }
      t = time_ms([&](int i) { fp8(1, i, y.data(), OutMode::store_bf16); }, 10, 2);
      record("fp8gemm", shape, "fp8-v1", t, bytes8, flops, copy_gbs, 0);
      t = time_ms([&](int i) { fp8(2, i, y.data(), OutMode::store_bf16); }, 10, 2);
      record("fp8gemm", shape, "fp8-v2", t, bytes8, flops, copy_gbs, 0);
      t = time_ms([&](int) { cuda::fp8_quantize_rows(x.data(), m, s.k, xq.data(), xs.data(), nullptr); }, 10, 2);
      record("fp8gemm", shape, "quant", t, 3.0 * double(m * s.k), 0, copy_gbs, 0);
      if (residual) {  // y += x . W^T into the fp32 residual, as o and down run
        const double bytes_add = bytes8 + 6.0 * double(m * s.n);
        t = time_ms([&](int i) { fp8(1, i, yf.data(), OutMode::add_f32); }, 10, 2);
        record("fp8gemm", shape, "fp8-v1-add", t, bytes_add, flops, copy_gbs, 0);
        t = time_ms([&](int i) { fp8(2, i, yf.data(), OutMode::add_f32); }, 10, 2);
        record("fp8gemm", shape, "fp8-v2-add", t, bytes_add, flops, copy_gbs, 0);
      }
      if (gate_up) {  // SwiGLU fused, against the GEMM then silu_mul
        const int64_t inter = s.n / 2;
        cuda::QScratch scratch{nullptr, 0, xq.data(), xs.data(), mmax * s.k, mmax};
        if (cuda::fp8_gemm_swiglu_can_run(x.data(), views[0], h.data(), m, inter, scratch)) {
          // Both forms quantize x in front, as the backend runs them.
          t = time_ms([&](int i) { cuda::fp8_gemm_swiglu(x.data(), views[size_t(i % copies)], h.data(), m, inter, nullptr, scratch); }, 10, 2);
          record("fp8gemm", shape, "fp8-swiglu", t, bytes8, flops, copy_gbs, 0);
          t = time_ms([&](int i) {
            cuda::fp8_quantize_rows(x.data(), m, s.k, xq.data(), xs.data(), nullptr);
            fp8(2, i, y.data(), OutMode::store_bf16);
            cuda::silu_mul(y.data(), h.data(), m, inter, nullptr);
          }, 10, 2);
          record("fp8gemm", shape, "fp8-v2+silu", t, bytes8, flops, copy_gbs, 0);
        } else {
          std::printf("fp8 SwiGLU: not taken at %s (the plan picks other tiles)\n", shape.c_str());
        }
      }
    }
  }
}

}  // namespace kiln::lab
