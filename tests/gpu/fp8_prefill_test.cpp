// The fp8 (W8A8) prefill path of session 11. The GEMM in the persistent wgmma kernel (gemm_wgmma.h's
// gemm_wgmma_fp8 and gemm_wgmma_fp8_swiglu) against the CPU reference (the activations fake-quantized per
// token, the weights dequantized, fp32 products), every configuration forced, on shapes off its
// tiles; the fused SwiGLU bit for bit against the unfused fp8 GEMM + silu_mul; and RMSNorm with the
// activation quantization fused (rmsnorm_fp8) byte for byte against rmsnorm + fp8_quantize_rows.
// Tolerances as quant_matmul_test.cpp: kTolBf16Out for bf16 outputs; the residual add (fp32) carries
// the fp8 tensor core's shorter running sum (kTolFp8Gemm there, 2e-3).
#include <cstring>
#include <span>

#include "backend/cpu/ops.h"
#include "backend/cuda/device_weight.h"
#include "gpu_test_util.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "quant_test_util.h"

namespace kiln::gputest {
namespace {

using cuda::OutMode;
constexpr double kTolFp8Add = 2e-3;

bool fp8_wgmma_testable() { return cuda::cuda_device_count() > 0 && cuda::fp8_gemm_available(); }

// x (M, K) quantized on the device as the backend does, W random fp8 with per-row scales.
struct Fp8Operands {
  HostMatrix w;
  std::vector<float> x, bias;
  cuda::DeviceWeight dw;
  DeviceBuffer<bf16> dx, dbias;
  DeviceBuffer<uint8_t> xq;
  DeviceBuffer<float> xs;
  Fp8Operands(int64_t m, int64_t n, int64_t k, uint32_t seed)
      : w(random_quantized(QuantFormat::fp8, n, k, k, seed)),
        x(random_bf16_values(size_t(m * k), seed + 1)),
        bias(random_bf16_values(size_t(n), seed + 2, 0.5f)),
        dw(cuda::upload_weight({&w})),
        dx(to_device_bf16(x)),
        dbias(to_device_bf16(bias)),
        xq(size_t(m * k)),
        xs(size_t(m)) {
    cuda::fp8_quantize_rows(dx.data(), m, k, xq.data(), xs.data(), nullptr);
  }
  const uint8_t* wq() const { return static_cast<const uint8_t*>(dw.view().data); }
  const float* ws() const { return dw.view().scales; }
  // The CPU reference: fake-quantized x times the dequantized W (+ bias).
  std::vector<float> reference(int64_t m, int64_t n, int64_t k, bool with_bias) const {
    ThreadPool pool(2);
    const std::vector<float> xr = fp8_fake_quantize_rows(x, m, k);
    std::vector<float> ref(size_t(m * n));
    cpu::matmul(pool, xr.data(), w.data.data(), with_bias ? bias.data() : nullptr, ref.data(), m, n, k);
    return ref;
  }
};

// Every configuration on M off the 128-row tile (17, 130, 513, 1100) and N off 128 / 192 / 256
// (136, 520, 2312, all % 8 == 0 as the TMA store needs), K one step (128), with a zero-filled tail
// (1040, 400) and many steps (4096: the ring wraps within a tile). The last two shapes give every
// block several tiles at every tile width on a 132-SM H200 (2048 x 4608: 288 / 384 / 576 tiles of
// 128x256 / 128x192 / 128x128; 1100 x 4608: 162 / 216 / 324), so the ring runs on across tiles
// with 2 and 4 K steps a tile and the staging buffers are reused.
TEST(GpuFp8Prefill, PersistentConfigsMatchReference) {
  if (!fp8_wgmma_testable()) GTEST_SKIP() << "the fp8 wgmma GEMM needs an sm_90 device and an sm_90a build";
  struct Shape {
    int64_t m, n, k;
  };
  uint32_t seed = 4100;
  for (Shape s : {Shape{17, 136, 128}, Shape{130, 520, 1040}, Shape{513, 2312, 4096}, Shape{2048, 1024, 1040},
                  Shape{2048, 4608, 256}, Shape{1100, 4608, 400}}) {
    Fp8Operands op(s.m, s.n, s.k, seed++);
    for (bool bias : {false, true}) {
      const std::vector<float> ref = op.reference(s.m, s.n, s.k, bias);
      const bf16* b = bias ? op.dbias.data() : nullptr;
      for (int config : {0, 4, 7, 8}) {  // bf16 stores
        SCOPED_TRACE(testing::Message() << "store M=" << s.m << " N=" << s.n << " K=" << s.k << " bias=" << bias
                                        << " config=" << config);
        DeviceBuffer<bf16> y(size_t(s.m * s.n));
        y.poison();
        ASSERT_TRUE(cuda::gemm_wgmma_fp8(config, op.xq.data(), op.xs.data(), op.wq(), op.ws(), b, y.data(),
                                         OutMode::store_bf16, s.m, s.n, s.k, nullptr));
        cuda::cuda_synchronize();
        EXPECT_LT(rel_error(from_device_bf16(y), ref), kTolBf16Out);
      }
      const std::vector<float> y0 = random_bf16_values(size_t(s.m * s.n), seed++);
      std::vector<float> want = ref;
      for (size_t i = 0; i < want.size(); ++i) want[i] += y0[i];
      for (int config : {0, 9, 10}) {  // residual adds into fp32
        SCOPED_TRACE(testing::Message() << "add M=" << s.m << " N=" << s.n << " K=" << s.k << " bias=" << bias
                                        << " config=" << config);
        DeviceBuffer<float> y{std::span<const float>(y0)};
        ASSERT_TRUE(cuda::gemm_wgmma_fp8(config, op.xq.data(), op.xs.data(), op.wq(), op.ws(), b, y.data(),
                                         OutMode::add_f32, s.m, s.n, s.k, nullptr));
        cuda::cuda_synchronize();
        EXPECT_LT(rel_error(y.to_host(), want), kTolFp8Add);
      }
    }
  }
}

// What it refuses (and launches nothing for): a config that does not match the mode, an output it
// has no epilogue for, rows the TMA store cannot write whole, K % 16 != 0.
TEST(GpuFp8Prefill, PersistentRefusesWhatItCannotRun) {
  if (!fp8_wgmma_testable()) GTEST_SKIP() << "the fp8 wgmma GEMM needs an sm_90 device and an sm_90a build";
  Fp8Operands op(64, 260, 128, 4200);
  DeviceBuffer<float> yf(size_t(64 * 260));
  DeviceBuffer<bf16> yb(size_t(64 * 260));
  auto run = [&](int config, void* y, OutMode mode, int64_t n, int64_t k) {
    return cuda::gemm_wgmma_fp8(config, op.xq.data(), op.xs.data(), op.wq(), op.ws(), nullptr, y, mode, 64, n, k,
                                nullptr);
  };
  EXPECT_FALSE(run(9, yb.data(), OutMode::store_bf16, 256, 128));  // a reduce-add config for a store
  EXPECT_FALSE(run(4, yf.data(), OutMode::add_f32, 256, 128));     // a store config for an add
  EXPECT_FALSE(run(0, yf.data(), OutMode::store_f32, 256, 128));   // no fp32-store epilogue
  EXPECT_FALSE(run(0, yb.data(), OutMode::store_bf16, 260, 128));  // N % 8 != 0
  EXPECT_FALSE(run(0, yb.data(), OutMode::store_bf16, 256, 120));  // K % 16 != 0
  // qmatmul's fp8 GEMM still serves those outputs (the one-tile-per-block kernel): checked against
  // the reference in quant_matmul_test.cpp (N = 300, 4500, 37).
}

// SwiGLU in the fp8 gate/up GEMM: the same bits as the fp8 (M, 2I) GEMM with the same tiles
// (config 4) then silu_mul, and within bf16 rounding of the CPU reference. (M, I) = (1000, 4096) and
// (2048, 1024) take config 4 on an H200, as gate_up does at prefill (can_run asserts it): more
// 128x128 tiles than SMs, 128x256 in fewer rounds than 128x192. (1000, 4096) is 256 output tiles
// (blocks run two, across the ring) with an M tail and a K tail (400). Shapes where the plan picks other
// tiles are refused: one tile of 128x256 (the 128x128 tiles fit one round), and (300, 2944) (one
// round of 128x192 beats one of 128x256).
TEST(GpuFp8Prefill, SwigluMatchesUnfused) {
  if (!fp8_wgmma_testable()) GTEST_SKIP() << "the fp8 wgmma GEMM needs an sm_90 device and an sm_90a build";
  struct Shape {
    int64_t m, inter, k;
  };
  uint32_t seed = 4300;
  for (Shape s : {Shape{1000, 4096, 400}, Shape{2048, 1024, 512}}) {
    SCOPED_TRACE(testing::Message() << "M=" << s.m << " I=" << s.inter << " K=" << s.k);
    Fp8Operands op(s.m, 2 * s.inter, s.k, seed++);
    DeviceBuffer<bf16> gu(size_t(s.m * 2 * s.inter)), h_unfused(size_t(s.m * s.inter)), h(size_t(s.m * s.inter));
    h.poison();
    ASSERT_TRUE(cuda::gemm_wgmma_fp8_swiglu_can_run(op.xq.data(), op.wq(), h.data(), s.m, s.inter, s.k));
    ASSERT_TRUE(cuda::gemm_wgmma_fp8(4, op.xq.data(), op.xs.data(), op.wq(), op.ws(), nullptr, gu.data(),
                                     OutMode::store_bf16, s.m, 2 * s.inter, s.k, nullptr));
    cuda::silu_mul(gu.data(), h_unfused.data(), s.m, s.inter, nullptr);
    ASSERT_TRUE(cuda::gemm_wgmma_fp8_swiglu(op.xq.data(), op.xs.data(), op.wq(), op.ws(), h.data(), s.m, s.inter,
                                            s.k, nullptr));
    cuda::cuda_synchronize();
    const std::vector<bf16> a = h.to_host(), b = h_unfused.to_host();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)), 0) << "fused and unfused bits differ";
    // The reference: silu(g) * u on the CPU from the reference product's halves.
    const std::vector<float> ref_gu = op.reference(s.m, 2 * s.inter, s.k, false);
    std::vector<float> ref(size_t(s.m * s.inter));
    for (int64_t r = 0; r < s.m; ++r)
      cpu::silu_mul(ref_gu.data() + r * 2 * s.inter, ref_gu.data() + r * 2 * s.inter + s.inter,
                    ref.data() + r * s.inter, s.inter);
    EXPECT_LT(rel_error(from_device_bf16(h), ref), kTolBf16Out);
  }
  Fp8Operands small(64, 2 * 128, 128, 4400);  // 1 x 1 tile of 128x256: the plan takes 128x128 tiles
  DeviceBuffer<bf16> h(size_t(64 * 128));
  EXPECT_FALSE(cuda::gemm_wgmma_fp8_swiglu_can_run(small.xq.data(), small.wq(), h.data(), 64, 128, 128));
  Fp8Operands wide(300, 2 * 2944, 128, 4401);
  DeviceBuffer<bf16> h2(size_t(300 * 2944));
  EXPECT_FALSE(cuda::gemm_wgmma_fp8_swiglu_can_run(wide.xq.data(), wide.wq(), h2.data(), 300, 2944, 128));
}

// rmsnorm_fp8 writes the bytes and scales of rmsnorm then fp8_quantize_rows, and (when asked) the
// same bf16 row: hidden sizes of Llama-3-8B (4096), Qwen2.5-7B (3584), SmolLM2 (576) and one that
// leaves threads of the block idle (100); a zero row (scale 0, codes 0); 37 rows (the reference
// rmsnorm runs its wide kernel) and 6 (a decode step's rows: the reference runs the one-pass
// kernel); rows it does not take (dim % 4 != 0, dim > 4096) refused.
TEST(GpuFp8Prefill, RmsnormFp8MatchesTwoKernels) {
  KILN_REQUIRE_GPU();
  if (!cuda::rmsnorm_fp8_fusable(4096)) GTEST_SKIP() << "KILN_RMSNORM_WIDE=0: no fused fp8 norm";
  for (int64_t rows : {37, 6})
  for (int64_t dim : {4096, 3584, 576, 100}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " dim=" << dim);
    std::vector<float> x = random_bf16_values(size_t(rows * dim), 4500 + uint32_t(dim), 3.0f);
    for (int64_t i = 0; i < dim; ++i) x[size_t(5 * dim + i)] = 0.0f;  // a zero row
    const std::vector<float> w = random_bf16_values(size_t(dim), 4600 + uint32_t(dim), 1.5f);
    DeviceBuffer<float> dx{std::span<const float>(x)};
    DeviceBuffer<bf16> dw = to_device_bf16(w), out_a(size_t(rows * dim)), out_b(size_t(rows * dim));
    DeviceBuffer<uint8_t> q_a(size_t(rows * dim)), q_b(size_t(rows * dim));
    DeviceBuffer<float> s_a{size_t(rows)}, s_b{size_t(rows)};
    out_b.poison();
    cuda::rmsnorm(dx.data(), nullptr, dw.data(), out_a.data(), rows, dim, 1e-5f, nullptr);
    cuda::fp8_quantize_rows(out_a.data(), rows, dim, q_a.data(), s_a.data(), nullptr);
    ASSERT_TRUE(cuda::rmsnorm_fp8(dx.data(), dw.data(), out_b.data(), q_b.data(), s_b.data(), rows, dim, 1e-5f, nullptr));
    cuda::cuda_synchronize();
    EXPECT_EQ(q_a.to_host(), q_b.to_host());
    EXPECT_EQ(s_a.to_host(), s_b.to_host());
    EXPECT_EQ(s_b.to_host()[5], 0.0f);
    const std::vector<bf16> oa = out_a.to_host(), ob = out_b.to_host();
    EXPECT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(bf16)), 0);
    // Without the bf16 row: the same bytes.
    q_b.poison();
    ASSERT_TRUE(cuda::rmsnorm_fp8(dx.data(), dw.data(), nullptr, q_b.data(), s_b.data(), rows, dim, 1e-5f, nullptr));
    cuda::cuda_synchronize();
    EXPECT_EQ(q_a.to_host(), q_b.to_host());
  }
  DeviceBuffer<float> dx{size_t(8192)};
  DeviceBuffer<bf16> dw(size_t(8192));
  DeviceBuffer<uint8_t> q(size_t(8192));
  DeviceBuffer<float> sc{size_t(2)};
  EXPECT_FALSE(cuda::rmsnorm_fp8(dx.data(), dw.data(), nullptr, q.data(), sc.data(), 1, 8192, 1e-5f, nullptr));
  EXPECT_FALSE(cuda::rmsnorm_fp8(dx.data(), dw.data(), nullptr, q.data(), sc.data(), 2, 1022, 1e-5f, nullptr));
}

}  // namespace
}  // namespace kiln::gputest
