// Prefill and decode attention against cpu::attention on the same bf16-rounded q, k, v.
#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/attention.h"

namespace kiln::gputest {
namespace {

struct Case {
  int heads, kv_heads, d;
};
const Case kCases[] = {{4, 4, 64}, {8, 2, 80}, {7, 1, 96}, {8, 2, 128}, {12, 1, 128}, {14, 2, 64}};

TEST(GpuAttention, PrefillCausalGqaOddLengths) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases) {
    for (auto [n_q, q_start] : {std::pair<int64_t, int64_t>{37, 0}, {37, 21}, {1, 70}, {100, 0}}) {
      SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " n_q " << n_q
                                      << " q_start " << q_start);
      const int64_t n_kv = q_start + n_q, kv_dim = int64_t(cs.kv_heads) * cs.d;
      auto q = random_bf16_values(size_t(n_q * cs.heads * cs.d), 11, 2.0f);
      auto k = random_bf16_values(size_t(n_kv * kv_dim), 12, 2.0f);
      auto v = random_bf16_values(size_t(n_kv * kv_dim), 13);
      std::vector<float> ref(q.size());
      cpu::attention(q.data(), k.data(), v.data(), ref.data(), n_q, q_start, cs.heads, cs.kv_heads, cs.d);
      auto dq = to_device_bf16(q), dk = to_device_bf16(k), dv = to_device_bf16(v);
      DeviceBuffer<bf16> out(q.size());
      out.poison();
      cuda::KvLayout kv{dk.data(), dv.data(), 0, kv_dim, cs.d};
      cuda::attention_prefill(dq.data(), kv, out.data(), n_q, q_start, cs.heads, cs.kv_heads, cs.d, nullptr);
      EXPECT_LT(rel_error(from_device_bf16(out), ref), kTolBf16Out);
    }
  }
}

TEST(GpuAttention, DecodeBatchSplitsGqa) {
  KILN_REQUIRE_GPU();
  const std::vector<int32_t> lens = {1, 37, 700};  // one split, a partial split, several splits
  const int64_t batch = int64_t(lens.size()), capacity = 800;
  for (Case cs : kCases) {
    SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d);
    const int64_t kv_dim = int64_t(cs.kv_heads) * cs.d, q_row = int64_t(cs.heads) * cs.d;
    auto q = random_bf16_values(size_t(batch * q_row), 14, 2.0f);
    auto k = random_bf16_values(size_t(batch * capacity * kv_dim), 15, 2.0f);
    auto v = random_bf16_values(size_t(batch * capacity * kv_dim), 16);
    std::vector<float> ref(q.size());
    for (int64_t b = 0; b < batch; ++b)  // one query at position len-1 attends to 0..len-1
      cpu::attention(q.data() + b * q_row, k.data() + b * capacity * kv_dim, v.data() + b * capacity * kv_dim,
                     ref.data() + b * q_row, 1, lens[size_t(b)] - 1, cs.heads, cs.kv_heads, cs.d);
    auto dq = to_device_bf16(q), dk = to_device_bf16(k), dv = to_device_bf16(v);
    DeviceBuffer<int32_t> dlen(lens);
    DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(batch, cs.heads, cs.d, capacity)));
    ws.poison();
    DeviceBuffer<bf16> out(q.size());
    out.poison();
    cuda::KvLayout kv{dk.data(), dv.data(), capacity * kv_dim, kv_dim, cs.d};
    cuda::attention_decode(dq.data(), kv, dlen.data(), capacity, out.data(),
                           cuda::decode_workspace(ws.data(), batch, cs.heads, cs.d, capacity), batch, cs.heads,
                           cs.kv_heads, cs.d, nullptr);
    EXPECT_LT(rel_error(from_device_bf16(out), ref), kTolBf16Out);
  }
}

}  // namespace
}  // namespace kiln::gputest
