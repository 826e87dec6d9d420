// Prefill and decode attention against cpu::attention on the same bf16-rounded q, k, v.
#include <string>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/attention.h"

namespace kiln::gputest {
namespace {

struct Case {
  int heads, kv_heads, d;
};
const Case kCases[] = {{4, 4, 64}, {8, 2, 80}, {7, 1, 96}, {8, 2, 128}, {12, 1, 128}, {14, 2, 64}, {20, 1, 64}};

// One prefill chunk against cpu::attention; q_offset shifts q (and out) by that many elements to
// force the unaligned fallback. Returns the kernel the call selected.
std::string check_prefill(Case cs, int64_t n_q, int64_t q_start, int64_t q_offset = 0) {
  SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " n_q " << n_q
                                  << " q_start " << q_start << " q_offset " << q_offset);
  const int64_t n_kv = q_start + n_q, kv_dim = int64_t(cs.kv_heads) * cs.d;
  auto q = random_bf16_values(size_t(n_q * cs.heads * cs.d), 11, 2.0f);
  auto k = random_bf16_values(size_t(n_kv * kv_dim), 12, 2.0f);
  auto v = random_bf16_values(size_t(n_kv * kv_dim), 13);
  std::vector<float> ref(q.size());
  cpu::attention(q.data(), k.data(), v.data(), ref.data(), n_q, q_start, cs.heads, cs.kv_heads, cs.d);
  std::vector<float> q_padded(size_t(q_offset), 0.0f);
  q_padded.insert(q_padded.end(), q.begin(), q.end());
  auto dq = to_device_bf16(q_padded), dk = to_device_bf16(k), dv = to_device_bf16(v);
  DeviceBuffer<bf16> out(q_padded.size());
  out.poison();
  cuda::KvLayout kv{dk.data(), dv.data(), 0, kv_dim, cs.d};
  cuda::attention_prefill(dq.data() + q_offset, kv, out.data() + q_offset, n_q, q_start, cs.heads, cs.kv_heads, cs.d,
                          nullptr);
  auto got = from_device_bf16(out);
  got.erase(got.begin(), got.begin() + q_offset);
  EXPECT_LT(rel_error(got, ref), kTolBf16Out);
  return cuda::attention_prefill_impl(dq.data() + q_offset, kv, out.data() + q_offset, cs.d);
}

TEST(GpuAttention, PrefillCausalGqaOddLengths) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases)
    for (auto [n_q, q_start] : {std::pair<int64_t, int64_t>{37, 0}, {37, 21}, {1, 70}, {100, 0}})
      EXPECT_EQ(check_prefill(cs, n_q, q_start), cs.d <= 64 ? "mma-d64" : "mma-d128");
}

// The tensor-core path across tile edges: lengths not multiples of 64, q_start not a multiple of
// 64 (the diagonal crosses two K/V tiles), exact multiples, and several query tiles.
TEST(GpuAttention, PrefillTensorCoreTileEdges) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases)
    for (auto [n_q, q_start] : {std::pair<int64_t, int64_t>{64, 0}, {65, 0}, {200, 93}, {130, 67}, {64, 64},
                                {257, 0}, {3, 190}, {127, 1}})
      EXPECT_EQ(check_prefill(cs, n_q, q_start), cs.d <= 64 ? "mma-d64" : "mma-d128");
}

// q and out 2 bytes off 16-byte alignment: the fp32 fallback, same answers.
TEST(GpuAttention, PrefillUnalignedFallback) {
  KILN_REQUIRE_GPU();
  for (Case cs : {Case{8, 2, 128}, Case{7, 1, 96}, Case{4, 4, 64}})
    EXPECT_EQ(check_prefill(cs, 70, 13, 1), "fp32-fallback");
}

void check_decode(Case cs, const std::vector<int32_t>& lens, int64_t capacity) {
  SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " capacity "
                                  << capacity);
  const int64_t batch = int64_t(lens.size());
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
  EXPECT_STREQ(cuda::attention_decode_impl(dq.data(), kv, out.data(), cs.d), cs.d <= 64 ? "mma-d64" : "mma-d128");
}

TEST(GpuAttention, DecodeBatchSplitsGqa) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases) check_decode(cs, {1, 37, 700}, 800);  // one split, a partial split, several
}

// Lengths around the tile and split edges, and a long one split many ways; the large capacity
// makes the grid wide, so most split blocks find no data and exit.
TEST(GpuAttention, DecodeLengthsAcrossSplits) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases) check_decode(cs, {1, 255, 257, 5000}, 5003);
  check_decode(Case{32, 8, 128}, {24, 64, 65}, 8192);
}

}  // namespace
}  // namespace kiln::gputest
