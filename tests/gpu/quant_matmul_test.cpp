// The quantized matrix products (kernels/cuda/quant) against the CPU reference: dequantize in fp32,
// then cpu::matmul, on random codes and scales, odd shapes, both group sizes, every output mode.
// Tolerances (normalized error, gpu_test_util.h): the fused GEMVs and the fp8 paths multiply the
// exact dequantized values (integers or e4m3 values times fp32 scales, applied in fp32), so fp32
// outputs differ from the reference only in summation order: kTolF32Out (1e-4). bf16 outputs carry
// one bf16 rounding: kTolBf16Out. The int8/int4 path for M > 64 multiplies a bf16 copy of W (each
// weight rounded once, relative 2^-9): kTolBf16Out for every mode. The fp8 wgmma GEMM (M > 16 on
// sm_90a) accumulates inside the tensor core with less than fp32 precision (Hopper's fp8 MMA keeps
// ~14 mantissa bits of the running sum, as DeepSeek-V3 reports; measured here 1e-4..8e-4 normalized
// at K = 272..1152): kTolFp8Gemm, still far below the W8A8 quantization error itself (~3%).
constexpr double kTolFp8Gemm = 2e-3;
#include <fmt/core.h>

#include <cstring>

#include "backend/cpu/ops.h"
#include "backend/cuda/device_weight.h"
#include "gpu_test_util.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "kernels/cuda/tile_counters.h"
#include "norm_produce_check.h"
#include "quant_test_util.h"

namespace kiln::gputest {
namespace {

using cuda::OutMode;

constexpr OutMode kModes[] = {OutMode::store_bf16, OutMode::store_f32, OutMode::add_f32};

struct Case {
  QuantFormat format;
  int64_t m, n, k, group;
};

std::string describe(const Case& c, OutMode mode, bool bias) {
  const char* f = c.format == QuantFormat::int8 ? "int8" : c.format == QuantFormat::int4 ? "int4" : "fp8";
  return fmt::format("{} M={} N={} K={} group={} mode={} bias={}", f, c.m, c.n, c.k, c.group, int(mode), bias);
}

// Runs qmatmul (the backend's dispatch) or, when kernel_only, the M <= 16 kernel itself, and checks
// it against the reference.
void check(const Case& c, OutMode mode, bool bias, uint32_t seed) {
  SCOPED_TRACE(describe(c, mode, bias));
  ThreadPool pool(2);
  HostMatrix w = random_quantized(c.format, c.n, c.k, c.group, seed);
  auto x = random_bf16_values(size_t(c.m * c.k), seed + 1);
  auto b = random_bf16_values(size_t(c.n), seed + 2, 0.5f);
  auto y0 = random_bf16_values(size_t(c.m * c.n), seed + 3);
  const std::vector<float> xr = c.format == QuantFormat::fp8 ? fp8_fake_quantize_rows(x, c.m, c.k) : x;
  std::vector<float> ref(size_t(c.m * c.n));
  cpu::matmul(pool, xr.data(), w.data.data(), bias ? b.data() : nullptr, ref.data(), c.m, c.n, c.k);
  if (mode == OutMode::add_f32)
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];

  cuda::DeviceWeight dw = cuda::upload_weight({&w});
  ASSERT_EQ(int(dw.format), int(c.format)) << "the shape should pack";
  auto dx = to_device_bf16(x), db = to_device_bf16(b);
  DeviceBuffer<bf16> wscratch(size_t(c.n * c.k));
  DeviceBuffer<uint8_t> xq(size_t(c.m * c.k));
  DeviceBuffer<float> xs(size_t(c.m));
  cuda::QScratch scratch{wscratch.data(), int64_t(wscratch.size()), xq.data(), xs.data(), c.m * c.k, c.m};
  auto run = [&](void* y) {
    cuda::qmatmul(dx.data(), dw.view(), bias ? db.data() : nullptr, y, mode, c.m, nullptr, {}, scratch);
  };
  const std::vector<float> out = run_into_output(mode, ref.size(), y0, run);
  const bool dequant_path = c.format != QuantFormat::fp8 && c.m > cuda::kQGemvSliceRows;
  const bool fp8_gemm_path = c.format == QuantFormat::fp8 && c.m > cuda::kGemvMaxRows && cuda::fp8_gemm_available();
  const double tol = mode == OutMode::store_bf16 || dequant_path ? kTolBf16Out : fp8_gemm_path ? kTolFp8Gemm : kTolF32Out;
  EXPECT_LT(rel_error(out, ref), tol);
}

// Every M the GEMV takes, odd N (not a multiple of the 16-row tile; 4500 takes the 4-warp blocks on
// an H200), K from one super-chunk to many, both group sizes of each integer format.
// Every int8/int4 GEMV version (v1 registers, v2 cp.async ring, v3 the default, v4 = v3 with x from
// L2, v5 = v3 with one tile per block; qmatmul.h). N = 129 at K = 4096 stages x for M <= 8 in 8-warp blocks; group 256 / 128 take
// v3's shifted group index, group 192 (3 super-chunks) falls back to v1.
TEST(GpuQuant, GemvEveryRowCount) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 100;
  for (int version : {1, 2, 3, 4, 5}) {
  cuda::qgemv_set_version(version);
  SCOPED_TRACE(testing::Message() << "qgemv v" << version);
  for (int64_t m : {1, 2, 3, 7, 8, 9, 15, 16})
    for (Case c : {Case{QuantFormat::int8, m, 37, 256, 256}, Case{QuantFormat::int8, m, 300, 1152, 32},
                   Case{QuantFormat::int8, m, 4500, 64, 64}, Case{QuantFormat::int4, m, 37, 256, 128},
                   Case{QuantFormat::int4, m, 300, 1152, 32}, Case{QuantFormat::int4, m, 4500, 128, 128},
                   Case{QuantFormat::int4, m, 129, 4096, 128}, Case{QuantFormat::int4, m, 45, 1024, 256},
                   Case{QuantFormat::int8, m, 45, 1024, 128}, Case{QuantFormat::int8, m, 21, 576, 192},
                   Case{QuantFormat::int8, m, 129, 2048, 2048}, Case{QuantFormat::fp8, m, 37, 272, 272},
                   Case{QuantFormat::fp8, m, 4500, 64, 64}, Case{QuantFormat::fp8, m, 129, 4096, 4096}})
      for (OutMode mode : kModes) check(c, mode, (m + int(mode)) % 2 == 0, seed++);
  }
  cuda::qgemv_set_version(0);
}

// More 16-row tiles than v3 has block slots (N = 9000: 563 tiles, 528 slots of 4-warp blocks on an
// H200), so blocks run one or two tiles dealt evenly; int8 per channel (one scale group a row)
// carries its scales with every super-chunk then. Against v5 (one tile a block) and the reference.
TEST(GpuQuant, GemvTilesDealtOverEverySlot) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 700;
  for (int version : {0, 5}) {
    cuda::qgemv_set_version(version);
    SCOPED_TRACE(testing::Message() << "qgemv version " << version);
    for (int64_t m : {1, 9})
      for (Case c : {Case{QuantFormat::int8, m, 9000, 256, 256}, Case{QuantFormat::int8, m, 9000, 128, 32},
                     Case{QuantFormat::int4, m, 9000, 256, 128}, Case{QuantFormat::int4, m, 9000, 256, 32}})
        for (OutMode mode : kModes) check(c, mode, (m + int(mode)) % 2 == 0, seed++);
  }
  cuda::qgemv_set_version(0);
}

// Tiles drawn at run time (KILN_QGEMV_DEAL, on by default where x is staged): N = 35200 is 2200
// tiles over 528 4-warp blocks (132 SMs; int8 at M = 1: 264 8-warp blocks, qgemv_v3_grid.h), so
// every block runs the few tiles its requests before the wait reach (v3_own_tiles: 1 to 3 here)
// and draws the rest from a per-launch counter (tile_counters.h, tile_draw.cuh). Against the
// reference at M = 1 and 9 (K = 4096 at M = 9 reads x from L2 and does not draw), every scale
// layout; then one launch repeated past the counter ring (2 kRing + 1 times): a counter the last
// draw did not zero would deal wrong tiles when its turn came again. The drawn tiles multiply in a
// fixed order whichever block runs them, so every repeat must equal the first bit for bit.
TEST(GpuQuant, GemvTilesDrawnAtRunTime) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 1100;
  for (int64_t m : {1, 9})
    for (Case c : {Case{QuantFormat::int4, m, 35200, 1024, 32}, Case{QuantFormat::int4, m, 35200, 1024, 256},
                   Case{QuantFormat::int8, m, 35200, 1024, 1024}, Case{QuantFormat::int8, m, 35200, 1024, 32},
                   Case{QuantFormat::int4, m, 35200, 4096, 128}})  // M = 9: x from L2
      for (OutMode mode : kModes) check(c, mode, (m + int(mode)) % 2 == 0, seed++);

  const Case c{QuantFormat::int4, 1, 35200, 4096, 32};
  HostMatrix w = random_quantized(c.format, c.n, c.k, c.group, seed);
  cuda::DeviceWeight dw = cuda::upload_weight({&w});
  auto dx = to_device_bf16(random_bf16_values(size_t(c.k), seed + 1));
  DeviceBuffer<float> y(size_t(c.n));
  auto run = [&] {
    cuda::qgemv(dx.data(), dw.view(), nullptr, y.data(), OutMode::store_f32, 1, nullptr);
    return y.to_host();
  };
  const std::vector<float> first = run();
  for (int i = 0; i < 2 * cuda::TileCounters::kRing; ++i) {
    const std::vector<float> again = run();
    ASSERT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float))) << "repeat " << i;
  }
}

// The residual-add GEMV with the next RMSNorm's first half (qgemv_add_norm: the batch-1 step's o and
// down) at long rows, which the backend tests' small models never reach: K = 14336 (Llama-3-8B's
// down: x's 1,792 sixteen-byte pieces take two rounds of 4 loads a lane at 8 warps) and K = 8320
// (its second round 16 pieces, ending inside warp 0). N = 512 (32 tiles: 8-warp blocks, one tile
// each). The residual must be the plain GEMV's add_f32 bit for bit and near the reference;
// z = bf16(y o weight) exactly; each tile's sum of y^2 within fp32 summation error.
TEST(GpuQuant, AddNormAtLongRowsMatchesPlainGemv) {
  KILN_REQUIRE_GPU();
  ThreadPool pool(2);
  uint32_t seed = 1500;
  constexpr int64_t N = 512;
  for (Case c : {Case{QuantFormat::int4, 1, N, 14336, 128}, Case{QuantFormat::int8, 1, N, 14336, 14336},
                 Case{QuantFormat::int4, 1, N, 8320, 32}, Case{QuantFormat::int8, 1, N, 8320, 128}}) {
    SCOPED_TRACE(describe(c, OutMode::add_f32, false));
    HostMatrix w = random_quantized(c.format, c.n, c.k, c.group, seed);
    const std::vector<float> x = random_bf16_values(size_t(c.k), seed + 1);
    const std::vector<float> y0 = random_bf16_values(size_t(N), seed + 2, 2.0f);
    std::vector<float> norm_w = random_bf16_values(size_t(N), seed + 3, 0.5f);
    for (float& v : norm_w) v = round_to_bf16(1.0f + v);
    seed += 4;
    cuda::DeviceWeight dw = cuda::upload_weight({&w});
    ASSERT_EQ(int(dw.format), int(c.format)) << "the shape should pack";
    auto dx = to_device_bf16(x), dnorm = to_device_bf16(norm_w);
    DeviceBuffer<float> y(static_cast<size_t>(N)), y_plain(static_cast<size_t>(N)), sumsq(static_cast<size_t>(N / 16));
    DeviceBuffer<float> y_exit(static_cast<size_t>(N)), sumsq_exit(static_cast<size_t>(N / 16));
    DeviceBuffer<bf16> z(static_cast<size_t>(N)), z_exit(static_cast<size_t>(N));
    y.upload(y0);
    y_plain.upload(y0);
    y_exit.upload(y0);
    cuda::qgemv_add_norm(dx.data(), dw.view(), y.data(), cuda::NormProduce{dnorm.data(), z.data(), sumsq.data()},
                         nullptr);
    cuda::qgemv(dx.data(), dw.view(), nullptr, y_plain.data(), OutMode::add_f32, 1, nullptr);
    // Releasing the next kernel at the exit (NextLaunch::at_exit) changes when it may start, not a bit.
    cuda::qgemv_add_norm(dx.data(), dw.view(), y_exit.data(),
                         cuda::NormProduce{dnorm.data(), z_exit.data(), sumsq_exit.data()}, nullptr,
                         cuda::NextLaunch::at_exit);
    cuda::cuda_synchronize();

    const std::vector<float> out = y.to_host();
    ASSERT_EQ(out, y_plain.to_host());
    ASSERT_EQ(out, y_exit.to_host());
    ASSERT_EQ(sumsq.to_host(), sumsq_exit.to_host());
    ASSERT_EQ(from_device_bf16(z), from_device_bf16(z_exit));
    std::vector<float> ref(static_cast<size_t>(N));
    cpu::matmul(pool, x.data(), w.data.data(), nullptr, ref.data(), 1, N, c.k);
    for (int64_t n = 0; n < N; ++n) ref[size_t(n)] += y0[size_t(n)];
    EXPECT_LT(rel_error(out, ref), kTolF32Out);
    ASSERT_NO_FATAL_FAILURE(expect_norm_produce(out, norm_w, z, sumsq));
  }
}

// int8 with x staged runs fp16 MMAs on fp16(x / 16) (qgemv_v3.cu, session 13): exact for bf16
// magnitudes 2^-13 .. 2^20. Each activation row has its own magnitude, 1e-2 .. 9e5 (fp16's largest
// after the scale is 65504 x 16 = 1.05e6), and each row's outputs must meet the fp32 tolerance on
// their own: M = 5 (x staged, one n-tile) and M = 1, per channel (kRow), group 128 (kShift) and
// group 32 (kG32). The fused forms run the same staging (GpuNormFold, GpuQuantBackend).
TEST(GpuQuant, Int8GemvWideActivationRange) {
  KILN_REQUIRE_GPU();
  ThreadPool pool(2);
  uint32_t seed = 1300;
  const float magnitude[] = {1e-2f, 1.0f, 1e2f, 1e4f, 9e5f};
  for (int64_t m : {5, 1})
    for (Case c : {Case{QuantFormat::int8, m, 300, 1152, 1152}, Case{QuantFormat::int8, m, 300, 1024, 128},
                   Case{QuantFormat::int8, m, 4500, 256, 32}})
      for (int first = 0; first < (m == 1 ? 5 : 1); ++first) {  // M = 1: each magnitude alone
        SCOPED_TRACE(describe(c, OutMode::store_f32, false) + fmt::format(" first magnitude {}", first));
        HostMatrix w = random_quantized(c.format, c.n, c.k, c.group, seed++);
        std::vector<float> x = random_bf16_values(size_t(c.m * c.k), seed++);
        for (int64_t r = 0; r < c.m; ++r)
          for (int64_t k = 0; k < c.k; ++k) {
            float& v = x[size_t(r * c.k + k)];
            v = round_to_bf16(v * magnitude[(first + r) % 5]);
          }
        std::vector<float> ref(size_t(c.m * c.n));
        cpu::matmul(pool, x.data(), w.data.data(), nullptr, ref.data(), c.m, c.n, c.k);
        cuda::DeviceWeight dw = cuda::upload_weight({&w});
        auto dx = to_device_bf16(x);
        DeviceBuffer<float> y(ref.size());
        cuda::qgemv(dx.data(), dw.view(), nullptr, y.data(), OutMode::store_f32, c.m, nullptr);
        const std::vector<float> out = y.to_host();
        for (int64_t r = 0; r < c.m; ++r) {
          const std::span<const float> o(out.data() + r * c.n, size_t(c.n)), e(ref.data() + r * c.n, size_t(c.n));
          EXPECT_LT(rel_error(o, e), kTolF32Out) << "activation row " << r << ", magnitude "
                                                  << magnitude[(first + r) % 5];
        }
      }
}

// M past the GEMV: 17 and 64 (16-row GEMV slices for int8/int4), 65 and 100 (dequantize + bf16
// GEMM), and the fp8 wgmma GEMM (its 128x128 and 128x256 tiles: N = 4500 at M = 300 fills an H200).
TEST(GpuQuant, PrefillRowCounts) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 900;
  for (int64_t m : {17, 64, 65, 100})
    for (Case c : {Case{QuantFormat::int8, m, 300, 1152, 32}, Case{QuantFormat::int8, m, 37, 256, 256},
                   Case{QuantFormat::int4, m, 300, 1152, 32}, Case{QuantFormat::int4, m, 129, 512, 128},
                   Case{QuantFormat::fp8, m, 300, 1152, 1152}, Case{QuantFormat::fp8, m, 37, 272, 272}})
      for (OutMode mode : kModes) check(c, mode, m % 2 == 1, seed++);
  for (OutMode mode : kModes) {
    check({QuantFormat::fp8, 300, 4500, 1024, 1024}, mode, true, seed++);
    check({QuantFormat::fp8, 513, 200, 1040, 1040}, mode, false, seed++);  // K tail: TMA zero fill
  }
}

// The dequantization kernel reads the packed layout back: every element equals the host's
// dequantized value rounded to bf16 (up to one bf16 step where the fp32 forms round differently).
TEST(GpuQuant, PackThenDequantizeRoundTrips) {
  KILN_REQUIRE_GPU();
  for (Case c : {Case{QuantFormat::int8, 1, 33, 192, 32}, Case{QuantFormat::int8, 1, 17, 320, 320},
                 Case{QuantFormat::int4, 1, 33, 384, 32}, Case{QuantFormat::int4, 1, 17, 384, 128},
                 Case{QuantFormat::fp8, 1, 9, 48, 48}}) {
    SCOPED_TRACE(describe(c, OutMode::store_bf16, false));
    HostMatrix w = random_quantized(c.format, c.n, c.k, c.group, 7);
    cuda::DeviceWeight dw = cuda::upload_weight({&w});
    DeviceBuffer<bf16> out(size_t(c.n * c.k));
    out.poison();
    cuda::dequantize_to_bf16(dw.view(), out.data(), nullptr);
    cuda::cuda_synchronize();
    std::vector<float> got = from_device_bf16(out);
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = round_to_bf16(w.data[i]);
      // 1e-6 absolute: the packed form adds q + offset and folds the offset into the min, so a value
      // near zero carries the min's fp32 rounding (~1e-4 of a scale of <= 1e-3 here).
      if (!(std::fabs(got[i] - want) <= std::fabs(want) * (1.0f / 128) + 1e-6f)) ++bad;
    }
    EXPECT_EQ(bad, 0);
  }
}

// Matrices stacked as the backend fuses them (q/k/v): one packed weight when formats and groups
// agree; bf16 when they differ or the shape does not pack.
TEST(GpuQuant, UploadStacksOrFallsBack) {
  KILN_REQUIRE_GPU();
  HostMatrix a = random_quantized(QuantFormat::int4, 64, 256, 128, 1), b = random_quantized(QuantFormat::int4, 16, 256, 128, 2);
  HostMatrix c32 = random_quantized(QuantFormat::int4, 16, 256, 32, 3), odd = random_quantized(QuantFormat::int8, 8, 96, 32, 4);
  EXPECT_EQ(int(cuda::upload_weight({&a, &b}).format), int(QuantFormat::int4));
  EXPECT_EQ(cuda::upload_weight({&a, &b}).rows, 80);
  EXPECT_EQ(int(cuda::upload_weight({&a, &c32}).format), int(QuantFormat::none));
  EXPECT_EQ(int(cuda::upload_weight({&odd}).format), int(QuantFormat::none));  // K = 96: no 64-wide super-chunks
  // The stacked product equals the two products one after the other.
  ThreadPool pool(2);
  auto x = random_bf16_values(3 * 256, 5);
  std::vector<float> ref(3 * 80), ra(3 * 64), rb(3 * 16);
  cpu::matmul(pool, x.data(), a.data.data(), nullptr, ra.data(), 3, 64, 256);
  cpu::matmul(pool, x.data(), b.data.data(), nullptr, rb.data(), 3, 16, 256);
  for (int m = 0; m < 3; ++m) {
    std::copy(ra.begin() + m * 64, ra.begin() + m * 64 + 64, ref.begin() + m * 80);
    std::copy(rb.begin() + m * 16, rb.begin() + m * 16 + 16, ref.begin() + m * 80 + 64);
  }
  cuda::DeviceWeight dw = cuda::upload_weight({&a, &b});
  auto dx = to_device_bf16(x);
  DeviceBuffer<float> y(ref.size());
  y.poison();
  cuda::qmatmul(dx.data(), dw.view(), nullptr, y.data(), OutMode::store_f32, 3, nullptr);
  cuda::cuda_synchronize();
  EXPECT_LT(rel_error(y.to_host(), ref), kTolF32Out);
}

// Per-token fp8 activations: the same bytes and scales as the CPU reference's encoder.
TEST(GpuQuant, Fp8ActivationQuantizationMatchesCpu) {
  KILN_REQUIRE_GPU();
  for (int64_t k : {64, 1000, 4096}) {
    const int64_t m = 5;
    auto x = random_bf16_values(size_t(m * k), 11, 3.0f);
    for (int64_t i = 0; i < k; ++i) x[size_t(2 * k + i)] = 0.0f;  // a zero row
    auto dx = to_device_bf16(x);
    DeviceBuffer<uint8_t> xq(size_t(m * k));
    DeviceBuffer<float> xs{size_t(m)};
    cuda::fp8_quantize_rows(dx.data(), m, k, xq.data(), xs.data(), nullptr);
    cuda::cuda_synchronize();
    auto q = xq.to_host();
    auto s = xs.to_host();
    int bad = 0;
    for (int64_t r = 0; r < m; ++r) {
      float amax = 0;
      for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[size_t(r * k + i)]));
      EXPECT_EQ(s[size_t(r)], amax / 448.0f) << "row " << r;
      const float inv = amax > 0 ? 448.0f / amax : 0.0f;
      for (int64_t i = 0; i < k; ++i)
        bad += q[size_t(r * k + i)] != quant::f32_to_e4m3(x[size_t(r * k + i)] * inv);
    }
    EXPECT_EQ(bad, 0) << "K=" << k;
  }
}

}  // namespace
}  // namespace kiln::gputest
