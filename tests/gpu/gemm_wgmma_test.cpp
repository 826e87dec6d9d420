// The Hopper GEMM versions (gemm v4-v19: wgmma + TMA, persistent configurations, 2-CTA clusters,
// the TMA-store / SwiGLU / reduce-add epilogues) against the CPU reference and bit for bit against
// one another where they compute the same sums; the generic GEMM tests are in matmul_test.cpp.
#include <cstring>
#include <iterator>
#include <utility>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "matmul_test_util.h"

namespace kiln::gputest {
namespace {

// v4 (wgmma + TMA) on M and N off its 128 x 128 / 128 x 256 tiles (M = 37: one partial tile; 130: a
// 2-row second tile; 513: 1 row past 4 tiles; N = 200, 4500 not multiples of 128 / 256), K a multiple
// of 8 but not of its 64-wide step (1000, 4104: TMA zero-fills the last step) or exactly one step
// (64); every mode, bias on and off. K = 37 (K % 8 != 0) must fall back (scalar path) and still be right.
// The first shapes take the 128x128 instantiation (fewer 128x256 tiles than SMs); the last ones
// (>= 132 tiles of 128x256) the 128x256 one; K = 1000 .. 4104 wraps the stage ring several times.
TEST(GpuMatmul, GemmWgmmaOddShapes) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(4)) GTEST_SKIP() << "gemm v4 (wgmma) needs an sm_90 device and an sm_90a build";
  for (int64_t m : {37, 130, 513})
    for (Shape s : {Shape{m, 200, 64}, Shape{m, 200, 1000}, Shape{m, 200, 4104}, Shape{m, 4500, 64},
                    Shape{m, 4500, 1000}, Shape{m, 200, 37}})
      for (auto mode : kModes)
        for (bool bias : {false, true}) check_matmul(s, mode, bias, Path::gemm, 4);
  check_matmul(Shape{130, 4500, 4104}, cuda::OutMode::add_f32, true, Path::gemm, 4);
  for (auto mode : kModes) check_matmul(Shape{2049, 2300, 520}, mode, mode != cuda::OutMode::store_f32, Path::gemm, 4);
  check_matmul(Shape{1100, 4500, 1544}, cuda::OutMode::store_bf16, true, Path::gemm, 4);
}

// v5 (persistent) and its forced configs v6 (ping-pong 128x128), v7 (cooperative 128x192), v8
// (cooperative 128x256), v9 (v8 + TMA-store epilogue) where blocks get several tiles (tiles > 132 SMs), so the TMA ring runs on
// across tiles and the ping-pong consumers hand over: K = 64 (one K step per tile: the ring wraps
// every 5-7 tiles), K = 520 / 1544 / 4104 (not multiples of 64 x the stage count), M and N off every
// tile (2049, 1100, 700; 2300, 4500, 3000 against 128 / 192 / 256), every mode and bias somewhere.
TEST(GpuMatmul, GemmPersistentOddShapes) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(5)) GTEST_SKIP() << "gemm v5 (wgmma) needs an sm_90 device and an sm_90a build";
  const Shape shapes[] = {Shape{2049, 2300, 64}, Shape{1100, 4500, 1544}, Shape{700, 3000, 4104},
                          Shape{1500, 1800, 520}, Shape{300, 257, 520}};
  for (int v = 5; v <= 9; ++v)
    for (int i = 0; i < int(std::size(shapes)); ++i)
      check_matmul(shapes[i], kModes[(v + i) % 3], (v + i) % 2 == 0, Path::gemm, v);
  // v9's TMA-store epilogue (bf16 out, N % 8 == 0): M tails inside a consumer's 64-row half and past
  // it (2049, 1100, 700, 130: the last tile's second half empty), N tails inside a 64-column box
  // (2304 = 9 x 256, 4504, 3000, 200), one tile per block and several; N % 8 != 0 falls back.
  // v16 / v17 (session 9, lab): the same staging with 128x128 / 128x192 tiles (configs 7 / 8).
  for (int v : {9, 16, 17})
    for (Shape s : {Shape{2049, 2304, 64}, Shape{1100, 4504, 1544}, Shape{700, 3000, 4104}, Shape{130, 200, 64},
                    Shape{300, 257, 520}, Shape{512, 4096, 1024}})
      for (bool bias : {false, true}) check_matmul(s, cuda::OutMode::store_bf16, bias, Path::gemm, v);
  // The raster groups of 16 m tiles (tile_mn, session 17): M = 4500 is 36 m tiles, two whole groups
  // and a short one of 4. A mapping that skipped a tile would leave it poisoned, and one that mapped
  // a tile twice would skip another, so the check against the reference covers the mapping.
  // Ping-pong (v6), cooperative 128x192 (v7) and 128x256 with the TMA store (v9), tails in M and N.
  for (int v : {6, 7, 9}) check_matmul(Shape{4500, 1800, 520}, cuda::OutMode::store_bf16, v == 9, Path::gemm, v);
}

// v10 / v11 (persistent, cooperative 128x224 tiles; v11 with the TMA-store epilogue in (64, 32)
// boxes, bf16 out with N % 8 == 0, else v10): N off the 224-wide tile (4500 = 20 x 224 + 20, 3000,
// 257, 677 = 3 x 224 + 5), several tiles per block (2049 x 4500: 340 tiles on 132 SMs) and one, K
// = 64 (the 5- / 3-stage ring wraps every 5 / 3 tiles), 520, 4104; every mode, bias somewhere.
TEST(GpuMatmul, GemmCoop224OddShapes) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(10)) GTEST_SKIP() << "gemm v10 (wgmma) needs an sm_90 device and an sm_90a build";
  const Shape shapes[] = {Shape{2049, 4500, 64}, Shape{700, 3000, 4104}, Shape{1500, 1800, 520},
                          Shape{300, 257, 520}, Shape{130, 677, 1000}, Shape{37, 200, 72}};
  for (int v : {10, 11})
    for (int i = 0; i < int(std::size(shapes)); ++i)
      for (auto mode : kModes) check_matmul(shapes[i], mode, (v + i) % 2 == 0, Path::gemm, v);
  // v11's staging and boxes: M tails inside and past a consumer's 64 rows (2049, 1100, 130, 37), N
  // tails inside a 32-column box (4504 = 20 x 224 + 24, 2248 = 10 x 224 + 8, 232, 200 < 224), one
  // tile per block and several; N % 8 != 0 (257) runs v10.
  for (Shape s : {Shape{2049, 4504, 64}, Shape{1100, 2248, 1544}, Shape{130, 232, 520}, Shape{37, 200, 4104},
                  Shape{300, 257, 520}})
    for (bool bias : {false, true}) check_matmul(s, cuda::OutMode::store_bf16, bias, Path::gemm, 11);
}

// v12 (128x256 tiles split over K between the 2 CTAs of a cluster, partials exchanged through
// distributed shared memory): K = 64 (one step: rank 1 runs none and sends zeros), 72 (one step
// each, the second ragged), 1000 (8 + 8), 4104 (33 + 32); N = 200 (the rank-1 half partly past N),
// 300 (the second tile's rank-1 half wholly past N), 4500 (18 tiles, the last one's rank-1 half
// partly past N); M = 37, 130, 513 (row tails); every mode, bias on and off. Then the o shape at
// M = 512 (the one-round case it is for) and bit-identical repeats (the exchange is a fixed-order add).
TEST(GpuMatmul, GemmClusterSplitKOddShapes) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(12)) GTEST_SKIP() << "gemm v12 (wgmma) needs an sm_90 device and an sm_90a build";
  std::printf("[   INFO   ] gemm v12: %d clusters of 2 resident at once (0: v12 runs v4)\n",
              cuda::gemm_wgmma_cluster_max_active());
  for (int64_t m : {37, 130, 513})
    for (Shape s : {Shape{m, 200, 64}, Shape{m, 300, 72}, Shape{m, 4500, 1000}, Shape{m, 300, 4104}})
      for (auto mode : kModes)
        for (bool bias : {false, true}) check_matmul(s, mode, bias, Path::gemm, 12);
  check_matmul(Shape{512, 4096, 4096}, cuda::OutMode::store_bf16, false, Path::gemm, 12);
  check_matmul(Shape{512, 4096, 4096}, cuda::OutMode::add_f32, true, Path::gemm, 12);

  const Shape s{513, 4500, 4104};
  auto x = random_bf16_values(size_t(s.m * s.k), 21);
  auto w = random_bf16_values(size_t(s.n * s.k), 22, 0.1f);
  auto dx = to_device_bf16(x), dw = to_device_bf16(w);
  DeviceBuffer<float> y(size_t(s.m * s.n));
  std::vector<float> first;
  for (int rep = 0; rep < 3; ++rep) {
    y.poison();
    cuda::gemm_version(12, dx.data(), dw.data(), nullptr, y.data(), cuda::OutMode::store_f32, s.m, s.n, s.k, nullptr);
    cuda::cuda_synchronize();
    std::vector<float> out = y.to_host();
    if (rep == 0)
      first = out;
    else
      ASSERT_EQ(0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float))) << "v12 rep " << rep;
  }
}

// Every row count of the list on odd N / K (K % 8 == 0 but not a multiple of 32 or 64: ragged last
// step; K = 64: one wgmma step, so no split is possible; K = 37: the scalar path), forced splits 1,
// 2, 3, 7 and the auto choice, the default (wgmma partials on sm_90a) and the mma.sync v2 partials.
// The wgmma GEMMs' add_f32 epilogue reads the residual in batches (epilogue_add.cuh); mode 3 is the
// same add through the general loop (what KILN_GEMM_ADD_BATCHED=0 selects). Both must agree bit
// for bit: the same sums in the same order. Whole blocks (o / down at M = 2048) and edge blocks
// (M = 333, N = 4500), on every persistent configuration, v4, v12 and v13-v19.
TEST(GpuMatmul, GemmBatchedAddEpilogueIsBitIdentical) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(4)) GTEST_SKIP() << "the batched epilogue is in the wgmma GEMMs (sm_90a)";
  const cuda::OutMode serial = cuda::OutMode(3);
  for (Shape s : {Shape{2048, 4096, 4096}, Shape{2048, 4096, 1024}, Shape{333, 4500, 1000}}) {
    SplitCase c(s, s.m == 333, 81, /*with_ref=*/s.m == 333);
    for (int v : {0, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}) {
      if (v > cuda::gemm_versions()) continue;
      SCOPED_TRACE(testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k << " v" << v);
      auto run = [&](cuda::OutMode mode) {
        return run_out(c, cuda::OutMode::add_f32, [&](void* y) {
          cuda::gemm_version(v, c.dx.data(), c.dw.data(), c.bias ? c.db.data() : nullptr, y, mode, s.m, s.n, s.k,
                             nullptr);
        });
      };
      const std::vector<float> batched = run(cuda::OutMode::add_f32), general = run(serial);
      EXPECT_EQ(0, std::memcmp(batched.data(), general.data(), batched.size() * sizeof(float)));
      if (s.m == 333) expect_close(c, cuda::OutMode::add_f32, batched);
    }
  }
}

// The persistent GEMM with its grid capped at a few SMs (gemm_persistent_set_sm_limit, kernel_lab
// --overlap's hook) computes the same tiles, each block walking more of them: the same bits as the
// full grid. Forced configs, since the auto plan may pick another tile for fewer SMs.
TEST(GpuMatmul, GemmPersistentCappedGridIsBitIdentical) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(5)) GTEST_SKIP() << "gemm v5 (wgmma) needs an sm_90 device and an sm_90a build";
  const Shape s{1100, 4504, 1544};
  SplitCase c(s, true, 83, /*with_ref=*/true);
  for (int v : {6, 9}) {  // ping-pong 128x128; cooperative 128x256 with the TMA store
    SCOPED_TRACE(testing::Message() << "v" << v);
    auto run = [&](int sms) {
      cuda::gemm_persistent_set_sm_limit(sms);
      std::vector<float> y = run_out(c, cuda::OutMode::store_bf16, [&](void* out) {
        cuda::gemm_version(v, c.dx.data(), c.dw.data(), c.db.data(), out, cuda::OutMode::store_bf16, s.m, s.n, s.k,
                           nullptr);
      });
      cuda::gemm_persistent_set_sm_limit(0);
      return y;
    };
    const std::vector<float> full = run(0), capped = run(7);
    EXPECT_EQ(0, std::memcmp(full.data(), capped.data(), full.size() * sizeof(float)));
    expect_close(c, cuda::OutMode::store_bf16, capped);
  }
}

// v13 / v14 / v15 (v4's cooperative 128 x 128 / 192 / 256 tile, 2-CTA clusters multicasting the
// W tile): M = 37 and 130 (one m tile: the partner CTA lies wholly past M; two: the second nearly
// empty), 513 (an odd fifth tile paired with an empty one); N = 200 (rank 1's half of the B tile
// partly or wholly past N), 4500 (many n tiles, the last ragged); K = 64 (one step), 1000, 4104
// (the 4- to 6-stage ring wrapping, a ragged last step); every mode, bias on and off. Then the
// M = 512 shapes they are for, bit for bit against the same tile without multicast (v4 runs
// 128x128 on o at M = 512, v7 cooperative 128x192, v8 cooperative 128x256: the same wgmmas in the
// same order, so a B half landing in the wrong place or a stage refilled early shows as a changed bit).
TEST(GpuMatmul, GemmMulticastOddShapes) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(13)) GTEST_SKIP() << "gemm v13-v15 (wgmma) need an sm_90 device and an sm_90a build";
  const int pairs[] = {cuda::gemm_wgmma_multicast_max_active(128), cuda::gemm_wgmma_multicast_max_active(192),
                       cuda::gemm_wgmma_multicast_max_active(256)};
  std::printf("[   INFO   ] gemm v13 / v14 / v15: %d / %d / %d clusters of 2 resident at once\n", pairs[0], pairs[1],
              pairs[2]);
  // Without clusters they run v4, and the twin comparison below would compare v4 with itself.
  if (*std::min_element(std::begin(pairs), std::end(pairs)) <= 0) GTEST_SKIP() << "no cluster of 2 fits on this device";
  for (int v : {13, 14, 15})
    for (int64_t m : {37, 130, 513})
      for (Shape s : {Shape{m, 200, 64}, Shape{m, 4500, 1000}, Shape{m, 200, 4104}})
        for (auto mode : kModes) check_matmul(s, mode, (m + v) % 2 == 1, Path::gemm, v);
  check_matmul(Shape{1100, 4500, 4104}, cuda::OutMode::add_f32, true, Path::gemm, 14);

  const std::pair<int, int> twins[] = {{13, 4}, {14, 7}, {15, 8}};  // (multicast version, same tile without)
  for (Shape s : {Shape{512, 4096, 4096}, Shape{512, 6144, 4096}}) {
    SplitCase c(s, false, 123, /*with_ref=*/false);
    for (auto [mc, plain] : twins) {
      SCOPED_TRACE(testing::Message() << "M=" << s.m << " N=" << s.n << " v" << mc << " vs v" << plain);
      if (plain == 4 && s.n != 4096) continue;  // v4 picks 128x128 tiles on o only (64 < 132 tiles of 128x256)
      auto run = [&](int v) {
        return run_out(c, cuda::OutMode::store_f32, [&](void* y) {
          cuda::gemm_version(v, c.dx.data(), c.dw.data(), nullptr, y, cuda::OutMode::store_f32, s.m, s.n, s.k, nullptr);
        });
      };
      const std::vector<float> a = run(mc), b = run(plain);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    }
  }
}

// The gate/up GEMM with SwiGLU in its epilogue (gemm_swiglu, prefill and batched decode on
// Hopper) against the unfused path (the default GEMM into (M, 2I) gate|up rows, then silu_mul), bit
// for bit: M = 17 (one m tile, batched decode), 300 (a consumer's 64 rows partly past M), 1100 (the
// last tile's second consumer 12 rows), 2049 (one row in the last tile); I = 14336 (Llama-3-8B),
// 1536 (SmolLM2); K = 1000, 520, 4104 (ragged last K steps). Shapes where the plan takes the
// 128x256 configuration for the unfused (M, 2I) GEMM (elsewhere the fused kernel declines). Where
// it must refuse (I % 128 != 0, M <= 16) it returns false; one shape is also checked on the CPU.
TEST(GpuMatmul, GemmSwigluMatchesUnfused) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(5)) GTEST_SKIP() << "the fused gate/up GEMM is a wgmma kernel (sm_90a)";
  struct Case {
    int64_t m, inter, k;
  };
  for (Case cs : {Case{17, 14336, 1000}, Case{300, 14336, 520}, Case{1100, 14336, 4104}, Case{2049, 1536, 520},
                  Case{4500, 14336, 520}}) {
    SCOPED_TRACE(testing::Message() << "M=" << cs.m << " I=" << cs.inter << " K=" << cs.k);
    auto x = random_bf16_values(size_t(cs.m * cs.k), 31);
    auto w = random_bf16_values(size_t(2 * cs.inter * cs.k), 32, 0.1f);
    auto dx = to_device_bf16(x), dw = to_device_bf16(w);
    DeviceBuffer<bf16> gu(size_t(cs.m * 2 * cs.inter)), h_ref(size_t(cs.m * cs.inter)), h(size_t(cs.m * cs.inter));
    ASSERT_TRUE(cuda::gemm_swiglu_ok(dx.data(), dw.data(), h.data(), cs.m, cs.inter, cs.k));
    cuda::gemm(dx.data(), dw.data(), nullptr, gu.data(), cuda::OutMode::store_bf16, cs.m, 2 * cs.inter, cs.k, nullptr);
    cuda::silu_mul(gu.data(), h_ref.data(), cs.m, cs.inter, nullptr);
    h.poison();
    ASSERT_TRUE(cuda::gemm_swiglu(dx.data(), dw.data(), h.data(), cs.m, cs.inter, cs.k, nullptr));
    cuda::cuda_synchronize();
    const std::vector<float> a = from_device_bf16(h), b = from_device_bf16(h_ref);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    if (cs.m == 300) {  // and against the CPU: silu(x . Wg^T) * (x . Wu^T)
      ThreadPool pool(int(std::max(2u, std::min(16u, std::thread::hardware_concurrency()))));
      std::vector<float> ref(size_t(cs.m * 2 * cs.inter));
      cpu::matmul(pool, x.data(), w.data(), nullptr, ref.data(), cs.m, 2 * cs.inter, cs.k);
      double max_err = 0.0;
      for (int64_t r = 0; r < cs.m; ++r)
        for (int64_t c = 0; c < cs.inter; ++c) {
          const float g = ref[size_t(r * 2 * cs.inter + c)], u = ref[size_t(r * 2 * cs.inter + cs.inter + c)];
          const float want = g / (1.0f + std::exp(-g)) * u;
          max_err = std::max(max_err, double(std::fabs(a[size_t(r * cs.inter + c)] - want)) / (1.0 + std::fabs(want)));
        }
      EXPECT_LT(max_err, 2e-2);
    }
  }
  auto x = random_bf16_values(size_t(64 * 256), 33);
  auto w = random_bf16_values(size_t(2 * 200 * 256), 34, 0.1f);
  auto dx = to_device_bf16(x), dw = to_device_bf16(w);
  DeviceBuffer<bf16> h(size_t(64 * 200));
  EXPECT_FALSE(cuda::gemm_swiglu(dx.data(), dw.data(), h.data(), 64, 200, 256, nullptr));  // I % 128 != 0
  EXPECT_FALSE(cuda::gemm_swiglu(dx.data(), dw.data(), h.data(), 16, 128, 256, nullptr));  // M <= 16: the GEMV's
}

// v18 / v19 (TMA reduce-add epilogue into the fp32 residual, 128x256 / 128x128 tiles) bit for bit
// against the register add of the same tiles and wgmma widths: v8 (cooperative 128x256) and v6
// (ping-pong 128x128: the same m64n128k16 per 64 rows): one writer per element and one fp32 add in
// both. M = 37, 130 (a consumer's rows partly or wholly past M), 513, 2049; N = 200 (a 32-column
// box partly past N), 4500 (the last tile's boxes past N), 4096; K = 64, 1000, 4104; bias on and
// off. N % 4 != 0 (258) falls back to the register epilogue (v18 runs v8's config; v19 runs v4).
TEST(GpuMatmul, GemmReduceAddMatchesRegisterAdd) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(18)) GTEST_SKIP() << "gemm v18 / v19 (wgmma) need an sm_90 device and an sm_90a build";
  uint32_t seed = 700;
  for (Shape s : {Shape{37, 200, 64}, Shape{130, 4500, 1000}, Shape{513, 4096, 4104}, Shape{2049, 4500, 520},
                  Shape{1024, 4096, 520}, Shape{300, 258, 1000}})
    for (bool bias : {false, true}) {
      SplitCase c(s, bias, seed += 10, /*with_ref=*/false);
      SCOPED_TRACE(testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k << " bias " << bias);
      auto run = [&](int v) {
        return run_out(c, cuda::OutMode::add_f32, [&](void* y) {
          cuda::gemm_version(v, c.dx.data(), c.dw.data(), bias ? c.db.data() : nullptr, y, cuda::OutMode::add_f32, s.m,
                             s.n, s.k, nullptr);
        });
      };
      for (auto [v, twin] : {std::pair{18, 8}, std::pair{19, 6}}) {
        if (v == 19 && s.n % 4 != 0) continue;  // v19's fallback is v4, not its ping-pong twin
        const std::vector<float> got = run(v), want = run(twin);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "v" << v << " vs v" << twin;
      }
      // The default (v5's plan, which takes the reduce-add tiles for add_f32 at M > 256 since session
      // 10) gives the bits of the register epilogue of the tiles its fp32 plan picks: 128x256 (v8;
      // M = 1024 here), 128x192 (v7), ping-pong 128x128 (v6), or one round of v4 (v4 itself at
      // M <= 256; config 10, whose bits are v6's, above).
      if (s.n % 4 != 0) continue;
      const int plan = cuda::gemm_wgmma_persistent_plan(s.m, s.n, s.k, /*bf16_out=*/false);
      const int twin = plan == 3 ? 8 : plan == 2 ? 7 : plan == 1 ? 6 : s.m > 256 ? 6 : 4;
      const std::vector<float> got = run(0), want = run(twin);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "default vs v" << twin;
    }
}

}  // namespace
}  // namespace kiln::gputest
