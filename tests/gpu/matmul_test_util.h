// What the matrix-product GPU tests share (matmul_test.cpp: GEMV, generic GEMM, split-K;
// gemm_wgmma_test.cpp: the Hopper GEMM versions; gemm_argmax_test.cpp: the greedy head): a shape,
// the check of one product against cpu::matmul in every output mode, which GEMM versions this device can test, and a case whose
// inputs and CPU reference are made once for several kernels run on it.
#pragma once

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/matmul.h"

namespace kiln::gputest {

struct Shape {
  int64_t m, n, k;
};

enum class Path { matmul, gemv, gemm };

// version: 0 = the default choice of gemv / gemm, v >= 1 = that kernel version (gemv_version /
// gemm_version); ignored for Path::matmul.
inline void check_matmul(Shape s, cuda::OutMode mode, bool bias, Path path, int version = 0) {
  const char* names[] = {" matmul", " gemv", " gemm"};
  SCOPED_TRACE(testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k << " mode=" << int(mode)
                                  << " bias=" << bias << names[int(path)] << " v" << version);
  ThreadPool pool(2);
  auto x = random_bf16_values(size_t(s.m * s.k), 1);
  auto w = random_bf16_values(size_t(s.n * s.k), 2, 0.1f);
  auto b = random_bf16_values(size_t(s.n), 3);
  auto y0 = random_bf16_values(size_t(s.m * s.n), 4);  // the residual add_f32 adds into
  std::vector<float> ref(size_t(s.m * s.n));
  cpu::matmul(pool, x.data(), w.data(), bias ? b.data() : nullptr, ref.data(), s.m, s.n, s.k);
  if (mode == cuda::OutMode::add_f32)
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];

  auto dx = to_device_bf16(x), dw = to_device_bf16(w), db = to_device_bf16(b);
  auto run = [&](void* y) {
    const bf16* bp = bias ? db.data() : nullptr;
    if (path == Path::gemm)
      cuda::gemm_version(version, dx.data(), dw.data(), bp, y, mode, s.m, s.n, s.k, nullptr);
    else if (path == Path::gemv)
      cuda::gemv_version(version, dx.data(), dw.data(), bp, y, mode, s.m, s.n, s.k, nullptr);
    else
      cuda::matmul(dx.data(), dw.data(), bp, y, mode, s.m, s.n, s.k, nullptr);
  };
  const std::vector<float> out = run_into_output(mode, ref.size(), y0, run);
  double tol = mode == cuda::OutMode::store_bf16 ? kTolBf16Out : kTolF32Out;
  EXPECT_LT(rel_error(out, ref), tol);
}

// gemm versions 4..19 (wgmma, sm_90a) run only on a cc 9.0 device; elsewhere they run v2, so testing
// them there would test nothing new: skip them, saying so once per version.
inline bool gemm_version_testable(int v) {
  if (v < 4 || cuda::gemm_wgmma_available()) return true;
  std::printf("[ SKIPPED ] gemm v%d (wgmma): the device is not sm_90 (or the build has no sm_90a code)\n", v);
  return false;
}

inline constexpr cuda::OutMode kModes[] = {cuda::OutMode::store_bf16, cuda::OutMode::store_f32, cuda::OutMode::add_f32};

// One shape's inputs and CPU reference (computed once, shared by every variant run on it).
struct SplitCase {
  Shape s;
  bool bias;
  std::vector<float> x, w, b, y0, ref;  // ref: x . W^T (+ b), without the add_f32 residual
  DeviceBuffer<bf16> dx, dw, db;
  SplitCase(Shape shape, bool with_bias, uint32_t seed, bool with_ref = true) : s(shape), bias(with_bias) {
    ThreadPool pool(int(std::max(2u, std::min(16u, std::thread::hardware_concurrency()))));
    x = random_bf16_values(size_t(s.m * s.k), seed);
    w = random_bf16_values(size_t(s.n * s.k), seed + 1, 0.1f);
    b = random_bf16_values(size_t(s.n), seed + 2);
    y0 = random_bf16_values(size_t(s.m * s.n), seed + 3);
    ref.resize(size_t(s.m * s.n));
    if (with_ref) cpu::matmul(pool, x.data(), w.data(), bias ? b.data() : nullptr, ref.data(), s.m, s.n, s.k);
    dx = to_device_bf16(x);
    dw = to_device_bf16(w);
    db = to_device_bf16(b);
  }
};

// Runs fn(y) into a fresh output buffer of `mode` (poisoned, or y0 for add_f32) and returns y as floats.
template <class F>
std::vector<float> run_out(const SplitCase& c, cuda::OutMode mode, F&& fn) {
  return run_into_output(mode, c.ref.size(), c.y0, fn);
}

// The case's CPU reference (plus y0 for add_f32) against a kernel's output, within the output's tolerance.
inline void expect_close(const SplitCase& c, cuda::OutMode mode, const std::vector<float>& out) {
  std::vector<float> ref = c.ref;
  if (mode == cuda::OutMode::add_f32)
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += c.y0[i];
  EXPECT_LT(rel_error(out, ref), mode == cuda::OutMode::store_bf16 ? kTolBf16Out : kTolF32Out);
}

}  // namespace kiln::gputest
