// What a residual-add GEMV with the next RMSNorm's first half (NormProduce, gemv_fused.h) must
// write beside the new residual y: z = bf16(y o weight) exactly, and each 16-row tile's sum of y^2
// within fp32 summation error of the double sum. Shared by the bf16 (GpuNormFold) and int8 / int4
// (GpuQuant) tests; call through ASSERT_NO_FATAL_FAILURE.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "gpu_test_util.h"

namespace kiln::gputest {

inline void expect_norm_produce(const std::vector<float>& y, const std::vector<float>& norm_weight,
                                const DeviceBuffer<bf16>& z, const DeviceBuffer<float>& sumsq) {
  const std::vector<float> zh = from_device_bf16(z), parts = sumsq.to_host();
  const int64_t n_rows = int64_t(y.size());
  ASSERT_EQ(n_rows % 16, 0) << "whole 16-row tiles";
  ASSERT_EQ(norm_weight.size(), y.size());
  ASSERT_EQ(zh.size(), y.size());
  ASSERT_EQ(int64_t(parts.size()), n_rows / 16);
  for (int64_t n = 0; n < n_rows; ++n)
    ASSERT_EQ(zh[size_t(n)], round_to_bf16(y[size_t(n)] * norm_weight[size_t(n)])) << "row " << n;
  for (int64_t t = 0; t < n_rows / 16; ++t) {
    double ref = 0;
    for (int64_t r = 0; r < 16; ++r) ref += double(y[size_t(16 * t + r)]) * y[size_t(16 * t + r)];
    ASSERT_NEAR(parts[size_t(t)], ref, 1e-5 * ref + 1e-30) << "tile " << t;
  }
}

}  // namespace kiln::gputest
