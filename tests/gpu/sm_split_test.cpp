// cuda::SmSplit (kernel_lab --overlap's green contexts): a kernel launched on either partition's
// stream, with buffers from the primary context, runs and writes the bits it writes on the whole
// GPU. The persistent GEMM (forced v9: the auto plan may pick another tile for fewer SMs) is capped
// to each partition's SM count, as the lab caps it.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cuda/sm_partition.h"
#include "gpu_test_util.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/matmul.h"
#include "matmul_test_util.h"

namespace kiln::gputest {
namespace {

TEST(GpuSmSplit, GemmOnEachPartitionWritesTheWholeGpusBits) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(9)) GTEST_SKIP() << "gemm v9 (wgmma) needs an sm_90 device and an sm_90a build";
  const int64_t m = 1100, n = 4504, k = 1544;
  const std::vector<float> x = random_bf16_values(size_t(m * k), 11), w = random_bf16_values(size_t(n * k), 12, 0.05f);
  DeviceBuffer<bf16> dx = to_device_bf16(x), dw = to_device_bf16(w), y(size_t(m * n));
  auto run = [&](cudaStream_t s, int sm_limit) {
    y.poison();
    cuda::cuda_synchronize();
    cuda::gemm_persistent_set_sm_limit(sm_limit);
    cuda::gemm_version(9, dx.data(), dw.data(), nullptr, y.data(), cuda::OutMode::store_bf16, m, n, k, s);
    cuda::stream_synchronize(s);
    cuda::gemm_persistent_set_sm_limit(0);
    return from_device_bf16(y);
  };
  const std::vector<float> whole = run(nullptr, 0);
  const cuda::SmSplit split(16);
  if (!split.ok()) GTEST_SKIP() << "no SM split: " << split.why();
  EXPECT_GE(split.first_sms(), 16);
  EXPECT_GT(split.rest_sms(), 0);
  const std::vector<float> first = run(split.first(), split.first_sms());
  const std::vector<float> rest = run(split.rest(), split.rest_sms());
  EXPECT_EQ(0, std::memcmp(whole.data(), first.data(), whole.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(whole.data(), rest.data(), whole.size() * sizeof(float)));
}

}  // namespace
}  // namespace kiln::gputest
