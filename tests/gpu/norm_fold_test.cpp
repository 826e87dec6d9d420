// The RMSNorm folded into the decode GEMVs around it (gemv_fused.h, session 12): the residual-add
// GEMV writes z = bf16(x o w) and each 16-row tile's sum of x^2 (NormProduce), the next GEMV scales
// its products by rsqrt(mean(x^2) + eps) (NormApply). Against the plain GEMV (the residual's bits),
// the host (z's bits, the partials) and the CPU reference of rmsnorm then gate/up then SwiGLU.
#include <cmath>
#include <cstdio>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv_fused.h"
#include "kernels/cuda/matmul.h"
#include "norm_produce_check.h"

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
    DeviceBuffer<float> y(nH), y_plain(nH), sumsq(nH / 16), y_exit(nH), sumsq_exit(nH / 16);
    DeviceBuffer<bf16> z(nH), h(nI), z_exit(nH);
    y.upload(resid0);
    y_plain.upload(resid0);
    y_exit.upload(resid0);
    cuda::gemv_add_norm(d_a.data(), d_wo.data(), y.data(), cuda::NormProduce{d_norm.data(), z.data(), sumsq.data()}, H,
                        K, nullptr);
    // Releasing the next kernel at the exit (NextLaunch::at_exit) changes when it may start, not a bit.
    cuda::gemv_add_norm(d_a.data(), d_wo.data(), y_exit.data(),
                        cuda::NormProduce{d_norm.data(), z_exit.data(), sumsq_exit.data()}, H, K, nullptr,
                        cuda::NextLaunch::at_exit);
    cuda::gemv(d_a.data(), d_wo.data(), nullptr, y_plain.data(), cuda::OutMode::add_f32, 1, H, K, nullptr);
    cuda::gemv_swiglu(z.data(), d_wgu.data(), h.data(), I, H, nullptr, cuda::NormApply{sumsq.data(), int(H / 16), eps});
    cuda::cuda_synchronize();

    // The residual: the plain GEMV's add, bit for bit (the fold changes only what follows it).
    const std::vector<float> x = y.to_host();
    ASSERT_EQ(x, y_plain.to_host());
    ASSERT_EQ(x, y_exit.to_host());
    ASSERT_EQ(sumsq.to_host(), sumsq_exit.to_host());
    ASSERT_EQ(from_device_bf16(z), from_device_bf16(z_exit));
    ASSERT_NO_FATAL_FAILURE(expect_norm_produce(x, norm_w, z, sumsq));

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

// The qkv GEMV with RoPE, the K/V write and a bias, folded (z and the partials as the residual-add
// GEMV writes them, here computed on the host) against rmsnorm then the same GEMV unfolded. The
// residual is large (|x| <= 8, s ~ 0.2) and the bias is not small, so a bias scaled with the
// products would show: the outputs must agree to bf16 rounding.
TEST(GpuNormFold, RopeKvFoldedMatchesNormKernelThenGemv) {
  KILN_REQUIRE_GPU();
  const int n_heads = 4, n_kv = 2, hd = 64, capacity = 8;
  const int64_t H = 256, N = int64_t(n_heads + 2 * n_kv) * hd, kv_dim = int64_t(n_kv) * hd;
  const float eps = 1e-5f;
  const size_t nH = static_cast<size_t>(H);
  const std::vector<float> x = random_bf16_values(nH, 11, 8.0f);
  std::vector<float> norm_w = random_bf16_values(nH, 12, 0.5f);
  for (float& v : norm_w) v = round_to_bf16(1.0f + v);
  const std::vector<float> w = random_bf16_values(static_cast<size_t>(N * H), 13, 0.05f);
  const std::vector<float> bias = random_bf16_values(static_cast<size_t>(N), 14, 1.0f);
  std::vector<float> z(nH), parts(nH / 16, 0.0f);
  for (int64_t n = 0; n < H; ++n) {
    z[size_t(n)] = round_to_bf16(x[size_t(n)] * norm_w[size_t(n)]);
    parts[size_t(n / 16)] += x[size_t(n)] * x[size_t(n)];
  }
  std::vector<float> inv_freq(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv_freq[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(hd));

  DeviceBuffer<bf16> d_z = to_device_bf16(z), d_w = to_device_bf16(w), d_bias = to_device_bf16(bias),
                     d_norm = to_device_bf16(norm_w);
  DeviceBuffer<float> d_x(nH), d_parts(nH / 16), d_inv(inv_freq.size());
  d_x.upload(x);
  d_parts.upload(parts);
  d_inv.upload(inv_freq);
  DeviceBuffer<int32_t> d_pos(1);
  d_pos.upload(std::vector<int32_t>{5});
  DeviceBuffer<bf16> xn(nH);
  auto run = [&](const bf16* in, const cuda::NormApply& norm) {
    DeviceBuffer<bf16> q(static_cast<size_t>(n_heads * hd)), k(static_cast<size_t>(capacity * kv_dim)),
        v(static_cast<size_t>(capacity * kv_dim));
    k.poison();
    v.poison();
    cuda::KvLayout kv;
    kv.k = k.data();
    kv.v = v.data();
    kv.seq_stride = capacity * kv_dim;
    kv.pos_stride = kv_dim;
    kv.head_dim = hd;
    cuda::RopeKvTarget t;
    t.position = d_pos.data();
    t.inv_freq = d_inv.data();
    t.rot_dim = hd;
    t.n_heads = n_heads;
    t.n_kv_heads = n_kv;
    t.head_dim = hd;
    t.q_out = q.data();
    t.kv = kv;
    cuda::gemv_rope_kv(in, d_w.data(), d_bias.data(), t, H, nullptr, norm);
    cuda::cuda_synchronize();
    std::vector<float> out = from_device_bf16(q), kh = from_device_bf16(k), vh = from_device_bf16(v);
    out.insert(out.end(), kh.begin() + 5 * kv_dim, kh.begin() + 6 * kv_dim);  // position 5's K and V
    out.insert(out.end(), vh.begin() + 5 * kv_dim, vh.begin() + 6 * kv_dim);
    return out;
  };
  cuda::rmsnorm(d_x.data(), nullptr, d_norm.data(), xn.data(), 1, H, eps, nullptr);
  const std::vector<float> ref = run(xn.data(), {});
  const std::vector<float> folded = run(d_z.data(), cuda::NormApply{d_parts.data(), int(H / 16), eps});
  const double err = rel_error(folded, ref);
  std::printf("[   info   ] folded qkv+RoPE (bias) vs rmsnorm then qkv+RoPE: relative error %.2e\n", err);
  EXPECT_LT(err, 1e-2);
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
