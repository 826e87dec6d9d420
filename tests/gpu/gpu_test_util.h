// Helpers of the GPU tests: skipping without a device, random bf16 data, normalized error.
// Tests reach the GPU only through kiln_cuda (DeviceBuffer, launchers): no CUDA runtime calls here.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "core/dtype.h"
#include "kernels/cuda/common.h"

namespace kiln::gputest {

using cuda::bf16;
using cuda::DeviceBuffer;

#define KILN_REQUIRE_GPU()                                                                      \
  do {                                                                                          \
    if (::kiln::cuda::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)

// n values uniform in [-scale, scale), rounded to bf16 (so host and device see the same numbers).
inline std::vector<float> random_bf16_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& f : v) f = round_to_bf16(dist(rng));
  return v;
}

inline DeviceBuffer<bf16> to_device_bf16(std::span<const float> v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  DeviceBuffer<bf16> d(v.size());
  d.upload(std::span<const bf16>(reinterpret_cast<const bf16*>(h.data()), h.size()));
  return d;
}

inline std::vector<float> from_device_bf16(const DeviceBuffer<bf16>& d) {
  std::vector<bf16> raw = d.to_host();
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, &raw[i], 2);
    out[i] = bf16_to_f32(bits);
  }
  return out;
}

// Runs run(y) on a fresh output of n values for `mode` (bf16, or fp32: poisoned, or holding y0 for
// add_f32, the residual it adds into), waits for the device, and returns the output as floats.
template <class F>
std::vector<float> run_into_output(cuda::OutMode mode, size_t n, std::span<const float> y0, F&& run) {
  if (mode == cuda::OutMode::store_bf16) {
    DeviceBuffer<bf16> y(n);
    y.poison();
    run(static_cast<void*>(y.data()));
    cuda::cuda_synchronize();
    return from_device_bf16(y);
  }
  DeviceBuffer<float> y(n);
  if (mode == cuda::OutMode::add_f32)
    y.upload(y0);
  else
    y.poison();
  run(static_cast<void*>(y.data()));
  cuda::cuda_synchronize();
  return y.to_host();
}

// ||out - ref|| / ||ref|| in double; +inf when any output is NaN or inf, so NaN never passes.
inline double rel_error(std::span<const float> out, std::span<const float> ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    double d = double(out[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-30));
}

// Tolerances. bf16 keeps 8 significant bits: one rounding is a relative error of at most 2^-9
// (~2e-3), about 1e-3 in norm over many values. Results stored in bf16 therefore sit near 1e-3
// of an fp32 reference computed on the same bf16 inputs; kernels whose bf16 intermediates are
// rounded twice (rope, attention's P.V in fp32 of bf16 inputs) stay below 1e-2. fp32 outputs of
// fp32-accumulated products differ from the reference only in summation order (~1e-6).
constexpr double kTolBf16Out = 1e-2;
constexpr double kTolF32Out = 1e-4;

}  // namespace kiln::gputest
