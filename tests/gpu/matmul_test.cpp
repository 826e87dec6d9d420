// GEMV, the generic GEMM and split-K against cpu::matmul on the same bf16-rounded inputs, every output
// mode, odd shapes (the Hopper GEMM versions: gemm_wgmma_test.cpp; shared helpers: matmul_test_util.h).
#include <algorithm>
#include <cstring>
#include <thread>

#include "matmul_test_util.h"

namespace kiln::gputest {
namespace {

// Every row count 1..16 through the default dispatch (matmul -> gemv). N not a multiple of 16 (the
// v2 row tile), K a multiple of 8 but not of 32 / 256 (v2's chunk group / warp step), K % 8 != 0
// (scalar path), N = 4500 (> 2 blocks per SM of 16 rows on an H200: v2's 4-warp blocks in one
// wave, x read behind a branch), N = 9000 (> 4 blocks per SM: 4-warp blocks in several waves, x
// through the predicated load; the smaller N take the 8-warp blocks), K = 4104 (several warp steps,
// ragged last one; with N = 64 the default is v3, split-K across blocks). Both U of two n-tiles
// (gemv_two_tile_step_groups) with 8-warp blocks: K = 4104 and 200 take U = 4, K = 1536 (192
// chunks: one stride of 8 warps at U = 6) U = 6; with 4-warp blocks (N = 4500, 9000): K = 3584
// (Qwen2.5's hidden) and 4104 take U = 4.
TEST(GpuMatmul, GemvAllRowCountsAndModes) {
  KILN_REQUIRE_GPU();
  for (int64_t m = 1; m <= 16; ++m)
    for (Shape s : {Shape{m, 37, 64}, Shape{m, 300, 200}, Shape{m, 64, 4104}, Shape{m, 33, 37}, Shape{m, 4500, 88},
                    Shape{m, 9000, 88}, Shape{m, 5, 8}, Shape{m, 300, 1536}, Shape{m, 4500, 3584},
                    Shape{m, 9000, 4104}})
      for (auto mode : kModes) check_matmul(s, mode, m % 3 == 0, Path::matmul);
}

// Every gemv version on its own, every M, bias on and off.
TEST(GpuMatmul, GemvEveryVersion) {
  KILN_REQUIRE_GPU();
  for (int v = 1; v <= cuda::gemv_versions(); ++v)
    for (int64_t m = 1; m <= 16; ++m)
      for (Shape s : {Shape{m, 129, 264}, Shape{m, 17, 1000}, Shape{m, 4500, 40}, Shape{m, 9000, 40}})
        for (auto mode : kModes) check_matmul(s, mode, (m + v) % 2 == 0, Path::gemv, v);
}

// v5 (gemv_wgmma.cu: TMA + wgmma, K split over a cluster of up to 8 blocks) and v6 (the same tiles
// persistent, K splits reduced by the last unit to arrive) where a row tile's
// splits are many and ragged: N = 300 (3 row tiles, the last 44 rows), K = 4104 (65 K steps: 8
// splits of 9, the last of 2, the last step 8 wide); N = 131 K = 200 (2 splits, 4 steps); M on both
// sides of the n8 / n16 boundary. On a device without sm_90a they run v2 (the fallback).
TEST(GpuMatmul, GemvWgmmaClusterSplits) {
  KILN_REQUIRE_GPU();
  for (int v : {5, 6})
    for (int64_t m : {1, 3, 8, 9, 16})
      for (Shape s : {Shape{m, 300, 4104}, Shape{m, 131, 200}})
        for (auto mode : kModes) check_matmul(s, mode, (m + v) % 2 == 1, Path::gemv, v);
  // v6's ring past its 12 stages and blocks with several units: N = 4500 K = 4104 (36 tiles, 3
  // splits of 22 / 22 / 21 steps), N = 20000 K = 1024 (157 tiles of 16 steps on 132 blocks).
  for (int64_t m : {1, 9, 16})
    for (Shape s : {Shape{m, 4500, 4104}, Shape{m, 20000, 1024}})
      for (auto mode : kModes) check_matmul(s, mode, m == 9, Path::gemv, 6);
}

// v3 (split-K across blocks) at every M on odd shapes: N = 37 (3 row blocks: many splits, ragged
// last tile) and 4500 (282 row blocks: < 4 per SM on an H200, the default-v3 range); K = 4104 (513
// chunks: S = 5 with a 1-chunk last split) and 1000 (125 chunks: 256-element splits, ragged last).
// Every mode, bias on half. Then the default dispatch on the same shapes (picks v3 on them).
TEST(GpuMatmul, GemvSplitKEveryRowCount) {
  KILN_REQUIRE_GPU();
  for (int64_t m = 1; m <= 16; ++m)
    for (Shape s : {Shape{m, 37, 4104}, Shape{m, 4500, 4104}, Shape{m, 37, 1000}, Shape{m, 4500, 1000}})
      for (auto mode : kModes) {
        check_matmul(s, mode, m % 2 == 1, Path::gemv, 3);
        if (m % 5 == 1) check_matmul(s, mode, m % 2 == 0, Path::gemv, 0);
      }
}

// v3's split reduction is in a fixed order (not arrival order) and its arrival counters reset
// themselves: repeated launches give the same bits, and a launch with a different grid in between
// (other N / K, so other counters and splits) does not disturb them.
TEST(GpuMatmul, GemvSplitKDeterministic) {
  KILN_REQUIRE_GPU();
  const int64_t N = 4500, K = 4104;
  for (int64_t m : {1, 7, 16}) {
    auto x = random_bf16_values(size_t(m * K), 11);
    auto w = random_bf16_values(size_t(N * K), 12, 0.1f);
    auto dx = to_device_bf16(x), dw = to_device_bf16(w);
    DeviceBuffer<float> y(size_t(m * N)), other(size_t(m * 37));
    std::vector<float> first;
    for (int rep = 0; rep < 4; ++rep) {
      y.poison();
      cuda::gemv_version(3, dx.data(), dw.data(), nullptr, y.data(), cuda::OutMode::store_f32, m, N, K, nullptr);
      cuda::gemv_version(3, dx.data(), dw.data(), nullptr, other.data(), cuda::OutMode::store_f32, m, 37, 1000,
                         nullptr);
      cuda::cuda_synchronize();
      std::vector<float> out = y.to_host();
      if (rep == 0)
        first = out;
      else
        ASSERT_EQ(0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float))) << "M=" << m << " rep " << rep;
    }
  }
}

// Every gemm version on odd shapes (M, N, K not multiples of any tile; K % 8 != 0 takes the scalar
// path), every mode, bias on some.
TEST(GpuMatmul, GemmOddShapes) {
  KILN_REQUIRE_GPU();
  for (int v = 0; v <= cuda::gemm_versions(); ++v) {
    if (!gemm_version_testable(v)) continue;
    for (Shape s : {Shape{17, 37, 64}, Shape{130, 129, 200}, Shape{257, 300, 136}, Shape{128, 128, 32},
                    Shape{3, 70, 40}, Shape{300, 257, 1000}, Shape{40, 50, 37}, Shape{129, 513, 72},
                    Shape{260, 255, 8}})
      for (auto mode : kModes) check_matmul(s, mode, s.m == 130 || s.m == 129, Path::gemm, v);
  }
}

// Large enough that the default picks v3 (>= 2 128x256 tiles per SM) and K spans many stages.
TEST(GpuMatmul, GemmLargeSquare) {
  KILN_REQUIRE_GPU();
  for (int v = 0; v <= cuda::gemm_versions(); ++v)
    if (gemm_version_testable(v)) check_matmul(Shape{512, 1024, 4096}, cuda::OutMode::store_f32, false, Path::gemm, v);
  check_matmul(Shape{2176, 4200, 264}, cuda::OutMode::add_f32, true, Path::gemm, 0);
}

// ---- split-K (gemm_splitk, matmul for kGemvMaxRows < M <= kSplitKMaxRows) ----

// The split-K scratch of the tests: kSplitKWorkspaceFloats (what the backend carves) + a guard
// region that must survive every launch (the kernels stay inside floats).
struct SplitWorkspace {
  static constexpr int64_t kGuard = 4096;
  DeviceBuffer<float> buf{size_t(cuda::kSplitKWorkspaceFloats + kGuard)};
  std::vector<float> guard = std::vector<float>(size_t(kGuard), 12345.0f);
  SplitWorkspace() { buf.upload(guard, size_t(cuda::kSplitKWorkspaceFloats)); }
  cuda::MatmulWorkspace ws(int64_t floats = cuda::kSplitKWorkspaceFloats) { return {buf.data(), floats}; }
  void check_guard() {
    std::vector<float> got(guard.size());
    buf.download(got, size_t(cuda::kSplitKWorkspaceFloats));
    EXPECT_EQ(0, std::memcmp(got.data(), guard.data(), guard.size() * sizeof(float)))
        << "split-K wrote past its workspace";
  }
};

// gemm_splitk(version, splits) on one case, every mode; the workspace poisoned first (an unwritten
// partial would show as NaN). Forced splits must really split when K has the steps (>= 64 each).
void check_splitk(const SplitCase& c, SplitWorkspace& sw, int version, int splits) {
  const Shape s = c.s;
  for (auto mode : kModes) {
    SCOPED_TRACE(testing::Message() << "split-K M=" << s.m << " N=" << s.n << " K=" << s.k << " mode=" << int(mode)
                                    << " bias=" << c.bias << " v" << version << " splits=" << splits);
    sw.buf.poison();
    sw.buf.upload(sw.guard, size_t(cuda::kSplitKWorkspaceFloats));
    int used = 0;
    std::vector<float> out = run_out(c, mode, [&](void* y) {
      used = cuda::gemm_splitk(version, splits, c.dx.data(), c.dw.data(), c.bias ? c.db.data() : nullptr, y, mode,
                               s.m, s.n, s.k, sw.ws(), nullptr);
    });
    EXPECT_EQ(used, cuda::gemm_splitk_plan(version, splits, s.m, s.n, s.k, cuda::kSplitKWorkspaceFloats));
    if (splits > 1 && s.k % 8 == 0 && s.k >= 64 * splits) {
      EXPECT_GT(used, 1);
    }
    if (splits == 1) {
      EXPECT_EQ(used, 1);
    }
    expect_close(c, mode, out);
  }
  sw.check_guard();
}

TEST(GpuMatmul, SplitKOddShapes) {
  KILN_REQUIRE_GPU();
  SplitWorkspace sw;
  uint32_t seed = 100;
  for (int64_t m : {17, 31, 64, 100, 128, 255, 256})
    for (Shape s : {Shape{m, 37, 1000}, Shape{m, 300, 4104}, Shape{m, 4500, 520}, Shape{m, 200, 64},
                    Shape{m, 129, 72}, Shape{m, 50, 37}}) {
      SplitCase c(s, (m + s.n) % 2 == 1, seed += 10);
      for (int version : {0, 2})
        for (int splits : {1, 2, 3, 7, 0}) check_splitk(c, sw, version, splits);
    }
}

// The Llama-3-8B shapes at batched-decode M (qkv, o, gate_up, down; lm_head's N = 128256 is covered
// by the kernel lab against cuBLAS), auto and forced splits, both partial kernels.
TEST(GpuMatmul, SplitKLlamaShapes) {
  KILN_REQUIRE_GPU();
  SplitWorkspace sw;
  uint32_t seed = 500;
  for (Shape s : {Shape{64, 4096, 4096}, Shape{64, 4096, 14336}, Shape{100, 6144, 4096}, Shape{17, 28672, 4096},
                  Shape{256, 4096, 4096}}) {
    SplitCase c(s, s.m == 100, seed += 10);
    for (int version : {0, 2})
      for (int splits : {0, 3, 7}) check_splitk(c, sw, version, splits);
  }
}

// A workspace holding fewer slices caps the split (and none at all means no split); the dispatch
// (matmul with a workspace) takes split-K for 16 < M <= 256 and gives the same bits as gemm_splitk's
// auto choice (unless KILN_GEMM_SPLITK overrides it), and matches the reference.
TEST(GpuMatmul, SplitKWorkspaceAndDispatch) {
  KILN_REQUIRE_GPU();
  SplitWorkspace sw;
  SplitCase c(Shape{64, 4096, 4096}, true, 900);
  const Shape s = c.s;
  const auto mode = cuda::OutMode::store_f32;
  for (int64_t cap_slices : {0, 1, 2, 3}) {
    const int64_t floats = cap_slices * s.m * s.n;
    int used = 0;
    std::vector<float> out = run_out(c, mode, [&](void* y) {
      used = cuda::gemm_splitk(0, 7, c.dx.data(), c.dw.data(), c.db.data(), y, mode, s.m, s.n, s.k,
                               cap_slices ? sw.ws(floats) : cuda::MatmulWorkspace{}, nullptr);
    });
    EXPECT_LE(used, std::max<int64_t>(cap_slices, 1)) << "cap " << cap_slices;
    if (cap_slices >= 2) {
      EXPECT_EQ(used, cap_slices);
    }
    expect_close(c, mode, out);
  }
  sw.check_guard();
  for (int64_t m : {17, 64, 256}) {
    SplitCase d(Shape{m, 4096, 4096}, false, 950 + uint32_t(m));
    for (auto md : kModes) {
      SCOPED_TRACE(testing::Message() << "matmul dispatch M=" << m << " mode=" << int(md));
      std::vector<float> a = run_out(d, md, [&](void* y) {
        cuda::matmul(d.dx.data(), d.dw.data(), nullptr, y, md, m, 4096, 4096, nullptr, sw.ws());
      });
      expect_close(d, md, a);
      if (!std::getenv("KILN_GEMM_SPLITK")) {
        std::vector<float> b = run_out(d, md, [&](void* y) {
          cuda::gemm_splitk(0, 0, d.dx.data(), d.dw.data(), nullptr, y, md, m, 4096, 4096, sw.ws(), nullptr);
        });
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
      }
    }
  }
}

// Bit-determinism: the same inputs twice give identical outputs, with other split-K launches (other
// shapes, other split counts, so other partials in the workspace) in between; auto and forced.
TEST(GpuMatmul, SplitKDeterministic) {
  KILN_REQUIRE_GPU();
  SplitWorkspace sw;
  SplitCase other(Shape{100, 300, 4104}, true, 1200, false);  // bits compared, no reference needed
  for (Shape s : {Shape{64, 4096, 14336}, Shape{255, 6144, 4096}, Shape{31, 300, 4104}}) {
    SplitCase c(s, true, 1300 + uint32_t(s.m), false);
    for (int version : {0, 2})
      for (int splits : {0, 3}) {
        for (auto mode : kModes) {
          std::vector<float> first;
          for (int rep = 0; rep < 3; ++rep) {
            std::vector<float> out = run_out(c, mode, [&](void* y) {
              cuda::gemm_splitk(version, splits, c.dx.data(), c.dw.data(), c.db.data(), y, mode, s.m, s.n, s.k,
                                sw.ws(), nullptr);
            });
            run_out(other, cuda::OutMode::store_f32, [&](void* y) {
              cuda::gemm_splitk(version, 2 + rep, other.dx.data(), other.dw.data(), other.db.data(), y,
                                cuda::OutMode::store_f32, 100, 300, 4104, sw.ws(), nullptr);
            });
            if (rep == 0)
              first = out;
            else
              ASSERT_EQ(0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float)))
                  << "M=" << s.m << " N=" << s.n << " v" << version << " splits=" << splits << " mode=" << int(mode)
                  << " rep " << rep;
          }
        }
      }
  }
}

}  // namespace
}  // namespace kiln::gputest
