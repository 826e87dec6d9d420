// GEMV and GEMM against cpu::matmul on the same bf16-rounded inputs, every output mode, odd shapes.
#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/matmul.h"

namespace kiln::gputest {
namespace {

struct Shape {
  int64_t m, n, k;
};

void check_matmul(Shape s, cuda::OutMode mode, bool bias, bool force_gemm) {
  SCOPED_TRACE(testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k << " mode=" << int(mode)
                                  << " bias=" << bias << (force_gemm ? " gemm" : " matmul"));
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
  std::vector<float> out;
  auto run = [&](void* y) {
    if (force_gemm)
      cuda::gemm(dx.data(), dw.data(), bias ? db.data() : nullptr, y, mode, s.m, s.n, s.k, nullptr);
    else
      cuda::matmul(dx.data(), dw.data(), bias ? db.data() : nullptr, y, mode, s.m, s.n, s.k, nullptr);
    cuda::cuda_synchronize();
  };
  if (mode == cuda::OutMode::store_bf16) {
    DeviceBuffer<bf16> y(ref.size());
    y.poison();
    run(y.data());
    out = from_device_bf16(y);
  } else {
    DeviceBuffer<float> y(ref.size());
    if (mode == cuda::OutMode::add_f32)
      y.upload(y0);
    else
      y.poison();
    run(y.data());
    out = y.to_host();
  }
  double tol = mode == cuda::OutMode::store_bf16 ? kTolBf16Out : kTolF32Out;
  EXPECT_LT(rel_error(out, ref), tol);
}

TEST(GpuMatmul, GemvAllRowCountsAndModes) {
  KILN_REQUIRE_GPU();
  for (int64_t m : {1, 2, 3, 5, 8, 11, 16})
    for (Shape s : {Shape{m, 37, 64}, Shape{m, 300, 200}, Shape{m, 64, 4096}, Shape{m, 33, 37}})
      for (auto mode : {cuda::OutMode::store_bf16, cuda::OutMode::store_f32, cuda::OutMode::add_f32})
        check_matmul(s, mode, m == 3, false);
}

TEST(GpuMatmul, GemmOddShapes) {
  KILN_REQUIRE_GPU();
  for (Shape s : {Shape{17, 37, 64}, Shape{130, 129, 200}, Shape{257, 300, 136}, Shape{128, 128, 32},
                  Shape{3, 70, 40}, Shape{300, 257, 1000}, Shape{40, 50, 37}})
    for (auto mode : {cuda::OutMode::store_bf16, cuda::OutMode::store_f32, cuda::OutMode::add_f32})
      check_matmul(s, mode, s.m == 130, true);
}

TEST(GpuMatmul, GemmLargeSquare) {
  KILN_REQUIRE_GPU();
  check_matmul(Shape{512, 1024, 4096}, cuda::OutMode::store_f32, false, true);
}

}  // namespace
}  // namespace kiln::gputest
