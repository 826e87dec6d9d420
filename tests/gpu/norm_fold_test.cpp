// The RMSNorm folded into the decode GEMVs around it (gemv_fused.h, session 12): the residual-add
// GEMV writes z = bf16(x o w) and each 16-row tile's sum of x^2 (NormProduce), the next GEMV scales
// its products by rsqrt(mean(x^2) + eps) (NormApply). Against the plain GEMV (the residual's bits),
// the host (z's bits, the partials) and the CPU reference of rmsnorm then gate/up then SwiGLU.
#include <cmath>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/gemv_fused.h"
#include "kernels/cuda/matmul.h"

namespace kiln::gputest {
namespace {

struct FoldCase {
  int64_t hidden, k_in, inter;
};

// y (hidden) = W (hidden x k_in) . a, in double.
std::vector<double> matvec(const std::vector<float>& w, const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<double> y(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) y[size_t(r)] += double(w[size_t(r * cols + k)]) * double(a[size_t(k)]);
  return y;
}

// hidden 256 / K 200 (a ragged warp step), SmolLM2's 576 / 1536, Llama-3-8B's 4096 with K = 4104
// (several warp steps, a ragged last one).
TEST(GpuNormFold, AddNormThenSwiGluMatchesReference) {
  KILN_REQUIRE_GPU();
  const float eps = 1e-5f;
  for (FoldCase fc : {FoldCase{256, 200, 40}, FoldCase{576, 576, 1536}, FoldCase{4096, 4104, 1024}}) {
    SCOPED_TRACE(testing::Message() << "hidden " << fc.hidden << " K " << fc.k_in << " inter " << fc.inter);
    const int64_t H = fc.hidden, K = fc.k_in, I = fc.inter;
    const size_t nH = static_cast<size_t>(H), nI = static_cast<size_t>(I);
    const std::vector<float> resid0 = random_bf16_values(size_t(H), 1, 2.0f);
    const std::vector<float> a = random_bf16_values(size_t(K), 2);
    const std::vector<float> wo = random_bf16_values(size_t(H * K), 3, 0.05f);
    std::vector<float> norm_w = random_bf16_values(size_t(H), 4, 0.5f);
    for (float& v : norm_w) v = round_to_bf16(1.0f + v);
    const std::vector<float> wgu = random_bf16_values(size_t(2 * I * H), 5, 0.05f);

    DeviceBuffer<bf16> d_a = to_device_bf16(a), d_wo = to_device_bf16(wo), d_norm = to_device_bf16(norm_w),
                       d_wgu = to_device_bf16(wgu);
    DeviceBuffer<float> y(nH), y_plain(nH), sumsq(nH / 16);
    DeviceBuffer<bf16> z(nH), h(nI);
    y.upload(resid0);
    y_plain.upload(resid0);
    cuda::gemv_add_norm(d_a.data(), d_wo.data(), y.data(), cuda::NormProduce{d_norm.data(), z.data(), sumsq.data()}, H,
                        K, nullptr);
    cuda::gemv(d_a.data(), d_wo.data(), nullptr, y_plain.data(), cuda::OutMode::add_f32, 1, H, K, nullptr);
    cuda::gemv_swiglu(z.data(), d_wgu.data(), h.data(), I, H, nullptr, cuda::NormApply{sumsq.data(), int(H / 16), eps});
    cuda::cuda_synchronize();

    // The residual: the plain GEMV's add, bit for bit (the fold changes only what follows it).
    const std::vector<float> x = y.to_host();
    ASSERT_EQ(x, y_plain.to_host());
    // z = bf16(x o w) exactly; each tile's partial within fp32 summation error of the double sum.
    const std::vector<float> zh = from_device_bf16(z), parts = sumsq.to_host();
    for (int64_t n = 0; n < H; ++n) ASSERT_EQ(zh[size_t(n)], round_to_bf16(x[size_t(n)] * norm_w[size_t(n)])) << n;
    for (int64_t t = 0; t < H / 16; ++t) {
      double ref = 0;
      for (int64_t r = 0; r < 16; ++r) ref += double(x[size_t(16 * t + r)]) * x[size_t(16 * t + r)];
      ASSERT_NEAR(parts[size_t(t)], ref, 1e-5 * ref + 1e-30) << "tile " << t;
    }

    // h against the CPU reference: rmsnorm of the residual (fp32), then gate/up and SwiGLU.
    std::vector<float> xn(nH);
    cpu::rmsnorm(x.data(), norm_w.data(), xn.data(), 1, H, eps);
    const std::vector<double> gu = matvec(wgu, xn, 2 * I, H);
    std::vector<float> gate(nI), up(nI), ref(nI);
    for (int64_t i = 0; i < I; ++i) {
      gate[size_t(i)] = float(gu[size_t(i)]);
      up[size_t(i)] = float(gu[size_t(I + i)]);
    }
    cpu::silu_mul(gate.data(), up.data(), ref.data(), I);
    const double err = rel_error(from_device_bf16(h), ref);
    std::printf("[   info   ] hidden %lld: folded gate/up+SwiGLU vs CPU reference, relative error %.2e\n",
                static_cast<long long>(H), err);
    EXPECT_LT(err, 1e-2);
  }
}

// The checks: a NormApply must carry K / 16 partials; a NormProduce its three pointers.
TEST(GpuNormFold, RejectsInconsistentArguments) {
  KILN_REQUIRE_GPU();
  DeviceBuffer<bf16> x(256), w(256 * 256), h(64);
  DeviceBuffer<float> y(256), sumsq(16);
  EXPECT_THROW(cuda::gemv_swiglu(x.data(), w.data(), h.data(), 64, 256, nullptr, cuda::NormApply{sumsq.data(), 8, 1e-5f}),
               std::exception);
  EXPECT_THROW(cuda::gemv_add_norm(x.data(), w.data(), y.data(), cuda::NormProduce{nullptr, nullptr, sumsq.data()}, 256,
                                   256, nullptr),
               std::exception);
}

}  // namespace
}  // namespace kiln::gputest
