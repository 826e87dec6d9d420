// The L2-ahead experiment (kernels/cuda/quant/l2_ahead.h): which bytes an armed GEMV launch asks
// into L2, and that asking changes no result. The range tests are host arithmetic and run without
// a device.
#include <cstring>

#include "backend/cuda/device_weight.h"
#include "gpu_test_util.h"
#include "kernels/cuda/quant/l2_ahead.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "quant_test_util.h"

namespace kiln::gputest {
namespace {

// A weight view over fake addresses: l2_ahead_tail only does arithmetic on them.
cuda::QWeight fake_weight(QuantFormat f, int64_t rows, int64_t cols, int64_t group) {
  cuda::QWeight w;
  w.format = f;
  w.rows = rows;
  w.cols = cols;
  w.group = group;
  w.data = reinterpret_cast<const void*>(uintptr_t(1) << 40);
  w.scales = reinterpret_cast<const float*>(uintptr_t(2) << 40);
  return w;
}

TEST(L2Ahead, TailIsWholeLastRowsAndTheirScales) {
  // int4 gate/up of Llama-3-8B: 2048 bytes a row, 32 groups of 128 (float2 each: 256 bytes a row).
  const cuda::QWeight w = fake_weight(QuantFormat::int4, 28672, 4096, 128);
  const cuda::L2Ahead a = cuda::l2_ahead_tail(w, 16 << 20, 500);
  const auto base = reinterpret_cast<const char*>(w.data);
  const auto sbase = reinterpret_cast<const char*>(w.scales);
  EXPECT_EQ(a.w_bytes, int64_t(16) << 20);  // 8192 whole rows
  EXPECT_EQ(a.w + a.w_bytes, base + 28672LL * 2048);
  EXPECT_EQ(a.s_bytes, 8192LL * 256);
  EXPECT_EQ(a.s + a.s_bytes, sbase + 28672LL * 256);
  EXPECT_EQ(a.delay_ns, 500);
  // A request short of one row still asks one row; more than the matrix asks all of it.
  EXPECT_EQ(cuda::l2_ahead_tail(w, 100, 0).w_bytes, 2048);
  const cuda::L2Ahead all = cuda::l2_ahead_tail(w, int64_t(1) << 40, 0);
  EXPECT_EQ(all.w, base);
  EXPECT_EQ(all.s, sbase);
}

TEST(L2Ahead, StartsOnSixteenBytesForPerChannelScales) {
  // int8 per channel: 8 bytes of scales a row, so an odd row count starts mid-16; the start is
  // rounded down (one row's scales more) and the length stays a multiple of 16.
  const cuda::QWeight w = fake_weight(QuantFormat::int8, 4096, 14336, 14336);
  const cuda::L2Ahead a = cuda::l2_ahead_tail(w, 3 * 14336, 0);
  EXPECT_EQ(a.w_bytes, 3 * 14336);
  EXPECT_EQ(a.s_bytes, 32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.s) % 16, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.w) % 16, 0u);
}

TEST(L2Ahead, NothingForOtherFormatsOrNoBytes) {
  EXPECT_EQ(cuda::l2_ahead_tail(fake_weight(QuantFormat::none, 64, 64, 0), 1 << 20, 0).w_bytes, 0);
  EXPECT_EQ(cuda::l2_ahead_tail(fake_weight(QuantFormat::fp8, 64, 64, 64), 1 << 20, 0).w_bytes, 0);
  EXPECT_EQ(cuda::l2_ahead_tail(fake_weight(QuantFormat::int4, 64, 256, 128), 0, 0).w_bytes, 0);
}

TEST(L2Ahead, ArmedOnceThenTaken) {
  cuda::qgemv_arm_l2_ahead(cuda::l2_ahead_tail(fake_weight(QuantFormat::int4, 64, 256, 128), 1024, 0));
  EXPECT_GT(cuda::qgemv_take_l2_ahead().w_bytes, 0);
  EXPECT_EQ(cuda::qgemv_take_l2_ahead().w_bytes, 0);
  cuda::qgemv_arm_l2_ahead(cuda::l2_ahead_tail(fake_weight(QuantFormat::int4, 64, 256, 128), 1024, 0));
  cuda::qgemv_disarm_l2_ahead();
  EXPECT_EQ(cuda::qgemv_take_l2_ahead().w_bytes, 0);
}

// An armed M = 1 GEMV (the whole of another matrix asked into L2, with a delay) writes the same
// bits as the unarmed one.
TEST(L2Ahead, ArmedGemvWritesTheSameBits) {
  KILN_REQUIRE_GPU();
  for (QuantFormat f : {QuantFormat::int4, QuantFormat::int8}) {
    SCOPED_TRACE(f == QuantFormat::int4 ? "int4" : "int8");
    HostMatrix w = random_quantized(f, 4500, 1024, 128, 7);
    HostMatrix next = random_quantized(f, 1000, 1024, 128, 8);
    cuda::DeviceWeight dw = cuda::upload_weight({&w}), dnext = cuda::upload_weight({&next});
    auto dx = to_device_bf16(random_bf16_values(1024, 9));
    auto run = [&](bool armed) {
      DeviceBuffer<float> y(4500);
      if (armed) cuda::qgemv_arm_l2_ahead(cuda::l2_ahead_tail(dnext.view(), int64_t(1) << 30, 1000));
      cuda::qgemv(dx.data(), dw.view(), nullptr, y.data(), cuda::OutMode::store_f32, 1, nullptr);
      EXPECT_EQ(cuda::qgemv_take_l2_ahead().w_bytes, 0) << "the launch takes the armed ranges";
      std::vector<float> h(4500);
      y.download(h);
      return h;
    };
    const std::vector<float> plain = run(false), armed = run(true);
    EXPECT_EQ(std::memcmp(plain.data(), armed.data(), plain.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace kiln::gputest
