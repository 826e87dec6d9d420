// The greedy head (matmul.h's gemm_argmax, session 34): the ids its GEMM epilogue and the partials'
// reduction pick must be the ids cuda::argmax picks from the logits the store_f32 GEMM writes for the
// same operands, row for row, ties and NaN rows included; one case also against the CPU.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cuda/sampling.h"
#include "matmul_test_util.h"

namespace kiln::gputest {
namespace {

struct ArgmaxCase {
  int64_t m, n, k;
};

// M = 300 (the last m tile's second consumer has no rows), 2049 (one row in the last tile), 700,
// 1088; N = 32000, 5003 (a 139-column last tile, odd N), 4500, 128256 (Llama 3's vocabulary); K =
// 520 (a ragged last K step), 1000, 4104, 256. In every case W rows 17, n / 2 and n - 1 (the last
// tile) are one vector 0.5 s (s = +-1) and every x row carries s: those three logits lead each row
// by ~K / 2, so each row's pick is a tie between equal products where the products are bitwise
// equal (then the lowest id must win). x row 5 holds a NaN: its row is all NaN, id 0 both ways.
TEST(GpuMatmul, GemmArgmaxMatchesLogitsArgmax) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(5)) GTEST_SKIP() << "the greedy head is a wgmma kernel (sm_90a)";
  for (ArgmaxCase cs : {ArgmaxCase{300, 32000, 520}, ArgmaxCase{2049, 5003, 1000}, ArgmaxCase{700, 4500, 4104},
                        ArgmaxCase{1088, 128256, 256}}) {
    SCOPED_TRACE(testing::Message() << "M=" << cs.m << " N=" << cs.n << " K=" << cs.k);
    auto x = random_bf16_values(size_t(cs.m * cs.k), 41);
    auto w = random_bf16_values(size_t(cs.n * cs.k), 42, 0.1f);
    const auto s = random_bf16_values(size_t(cs.k), 43);
    const int64_t dup[] = {17, cs.n / 2, cs.n - 1};
    for (int64_t kk = 0; kk < cs.k; ++kk) {
      const float sign = s[size_t(kk)] < 0 ? -1.0f : 1.0f;
      for (int64_t r : dup) w[size_t(r * cs.k + kk)] = 0.5f * sign;
      for (int64_t r = 0; r < cs.m; ++r) x[size_t(r * cs.k + kk)] = round_to_bf16(x[size_t(r * cs.k + kk)] + sign);
    }
    x[size_t(5 * cs.k + 3)] = std::numeric_limits<float>::quiet_NaN();
    auto dx = to_device_bf16(x), dw = to_device_bf16(w);
    DeviceBuffer<float> logits(size_t(cs.m * cs.n));
    DeviceBuffer<int32_t> ref_ids(size_t(cs.m)), ids(size_t(cs.m));
    DeviceBuffer<float2> parts(size_t(cuda::gemm_argmax_parts(cs.m, cs.n)));
    cuda::gemm(dx.data(), dw.data(), nullptr, logits.data(), cuda::OutMode::store_f32, cs.m, cs.n, cs.k, nullptr);
    cuda::argmax(logits.data(), cs.m, cs.n, ref_ids.data(), nullptr);
    ids.poison();
    ASSERT_TRUE(cuda::gemm_argmax_ok(dx.data(), dw.data(), cs.m, cs.n, cs.k));
    ASSERT_TRUE(cuda::gemm_argmax(dx.data(), dw.data(), parts.data(), ids.data(), cs.m, cs.n, cs.k, nullptr));
    cuda::cuda_synchronize();
    const std::vector<int32_t> got = ids.to_host(), want = ref_ids.to_host();
    const std::vector<float> lg = logits.to_host();
    int ties = 0;
    for (int64_t r = 0; r < cs.m; ++r) {
      ASSERT_EQ(got[size_t(r)], want[size_t(r)]) << "row " << r;
      if (r == 5) {
        EXPECT_EQ(got[size_t(r)], 0);
        continue;
      }
      EXPECT_TRUE(got[size_t(r)] == dup[0] || got[size_t(r)] == dup[1] || got[size_t(r)] == dup[2]) << "row " << r;
      const float* row = lg.data() + r * cs.n;
      if (row[dup[0]] == row[dup[1]] && row[dup[1]] == row[dup[2]]) {
        ++ties;
        EXPECT_EQ(got[size_t(r)], dup[0]) << "row " << r;
      }
    }
    RecordProperty("ties_" + std::to_string(cs.m), ties);
    if (cs.m == 300) {  // the CPU's logits pick the same tied set's lowest id, up to fp32 order
      ThreadPool pool(int(std::max(2u, std::min(16u, std::thread::hardware_concurrency()))));
      std::vector<float> ref(size_t(cs.m * cs.n));
      cpu::matmul(pool, x.data(), w.data(), nullptr, ref.data(), cs.m, cs.n, cs.k);
      for (int64_t r = 0; r < cs.m; ++r) {
        if (r == 5) continue;
        const float* row = ref.data() + r * cs.n;
        const int64_t best = std::max_element(row, row + cs.n) - row;
        EXPECT_NEAR(row[best], row[got[size_t(r)]], 1e-3 * std::fabs(row[best])) << "row " << r;
      }
    }
  }
  // Where it must refuse (M <= kSplitKMaxRows: the logits' GEMM is split there) it launches nothing.
  auto x = random_bf16_values(size_t(256 * 256), 44);
  auto w = random_bf16_values(size_t(32000 * 256), 45, 0.1f);
  auto dx = to_device_bf16(x), dw = to_device_bf16(w);
  DeviceBuffer<int32_t> ids(256);
  DeviceBuffer<float2> parts(size_t(cuda::gemm_argmax_parts(256, 32000)));
  EXPECT_FALSE(cuda::gemm_argmax_ok(dx.data(), dw.data(), 256, 32000, 256));
  EXPECT_FALSE(cuda::gemm_argmax(dx.data(), dw.data(), parts.data(), ids.data(), 256, 32000, 256, nullptr));
}

}  // namespace
}  // namespace kiln::gputest
