// The qkv GEMM with RoPE in its epilogue (matmul.h's gemm_rope_kv, session 35) against the two
// kernels it replaces, the qkv GEMM then rope_qkv_slots (a pool, by slot) or rope_qkv (a
// contiguous cache, by position): q, the cache's K/V (bf16, or int8 / fp8 bytes and their
// scales) must be the same bits. Ragged M (the last tile's second consumer half dead), ragged K,
// both rotation layouts, head_dim 64 and 128, a bias, positions past the (cos, sin) table.
#include <cmath>
#include <cstring>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "matmul_test_util.h"

namespace kiln::gputest {
namespace {

using cuda::KvQuant;

struct RopeCase {
  int64_t m, k;
  int heads, kv_heads, head_dim;
  bool interleaved, bias;
};

// A cache of n_slots positions in one of the forms the epilogue writes, zeroed.
struct Cache {
  DeviceBuffer<bf16> k, v;
  DeviceBuffer<uint8_t> k8, v8;
  DeviceBuffer<float> ks, vs;
  cuda::KvLayout kv;

  Cache(KvQuant f, bool by_slot, int64_t n_slots, int kv_heads, int d) {
    const int64_t kv_dim = int64_t(kv_heads) * d;
    kv = cuda::KvLayout{nullptr, nullptr, by_slot ? 0 : n_slots * kv_dim, kv_dim, d};
    if (f == KvQuant::none) {
      k = DeviceBuffer<bf16>(size_t(n_slots * kv_dim)), v = DeviceBuffer<bf16>(k.size());
      k.zero(), v.zero();
      kv.k = k.data(), kv.v = v.data();
      return;
    }
    k8 = DeviceBuffer<uint8_t>(size_t(n_slots * kv_dim)), v8 = DeviceBuffer<uint8_t>(k8.size());
    ks = DeviceBuffer<float>(size_t(n_slots * kv_heads)), vs = DeviceBuffer<float>(ks.size());
    k8.zero(), v8.zero(), ks.zero(), vs.zero();
    kv.quant = f;
    kv.k8 = k8.data(), kv.v8 = v8.data(), kv.k_scale = ks.data(), kv.v_scale = vs.data();
    kv.scale_seq_stride = by_slot ? 0 : kv_heads * n_slots;
    kv.scale_head_stride = n_slots;
  }
  template <class T>
  static std::vector<uint8_t> bytes(const DeviceBuffer<T>& b) {
    const std::vector<T> h = b.to_host();
    std::vector<uint8_t> out(h.size() * sizeof(T));
    if (!h.empty()) std::memcpy(out.data(), h.data(), out.size());
    return out;
  }
  // Every byte the writes can reach: K, V and the scales.
  std::vector<std::vector<uint8_t>> contents() const {
    if (kv.quant == KvQuant::none) return {bytes(k), bytes(v)};
    return {bytes(k8), bytes(v8), bytes(ks), bytes(vs)};
  }
};

TEST(GpuMatmul, GemmRopeEqualsGemmThenRope) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(5)) GTEST_SKIP() << "the RoPE epilogue is a wgmma kernel (sm_90a)";
  // M = 2000: 16 m tiles, the last one's second consumer has 16 live rows of 64; K = 1000: a ragged
  // last K step. N = 6144 (Llama 3's qkv width) so the plan picks the 128x256 staged tiles.
  for (RopeCase cs : {RopeCase{2000, 1000, 32, 8, 128, false, false}, RopeCase{2048, 520, 64, 16, 64, true, true},
                      RopeCase{2000, 256, 64, 16, 64, false, false}}) {
    for (KvQuant f : {KvQuant::none, KvQuant::int8, KvQuant::fp8})
      for (bool by_slot : {true, false}) {
        SCOPED_TRACE(testing::Message() << "M=" << cs.m << " K=" << cs.k << " d=" << cs.head_dim << " interleaved "
                                        << cs.interleaved << " bias " << cs.bias << " cache " << int(f) << " by slot "
                                        << by_slot);
        const int d = cs.head_dim;
        const int64_t q_dim = int64_t(cs.heads) * d, kv_dim = int64_t(cs.kv_heads) * d, n = q_dim + 2 * kv_dim;
        const int64_t n_slots = 4096, table_positions = 1000;
        auto dx = to_device_bf16(random_bf16_values(size_t(cs.m * cs.k), 51));
        auto dw = to_device_bf16(random_bf16_values(size_t(n * cs.k), 52, 0.05f));
        auto dbias = to_device_bf16(random_bf16_values(size_t(n), 53));
        const bf16* bias = cs.bias ? dbias.data() : nullptr;
        std::vector<int32_t> pos(size_t(cs.m)), slots(size_t(cs.m));
        for (int64_t i = 0; i < cs.m; ++i) {
          // Distinct slots (131 is odd, n_slots a power of 2); by position, distinct positions < n_slots.
          pos[size_t(i)] = by_slot ? int32_t(7 * i % 1500) : int32_t((i * 3 + 1) % n_slots);
          slots[size_t(i)] = int32_t((i * 131 + 5) % n_slots);
        }
        std::vector<float> inv(size_t(d / 2));
        for (int i = 0; i < d / 2; ++i) inv[size_t(i)] = std::pow(500000.0f, -2.0f * float(i) / float(d));
        DeviceBuffer<int32_t> dpos(pos), dslots(slots);
        DeviceBuffer<float> dinv(inv);
        DeviceBuffer<float2> table(size_t(table_positions * d / 2));  // positions past 1000 computed
        cuda::rope_table_fill(table.data(), table_positions, dinv.data(), d, nullptr);
        const int32_t* slot_ptr = by_slot ? dslots.data() : nullptr;

        // The two kernels.
        Cache want(f, by_slot, n_slots, cs.kv_heads, d);
        DeviceBuffer<bf16> qkv(size_t(cs.m * n)), q_want(size_t(cs.m * q_dim));
        q_want.zero();
        cuda::gemm(dx.data(), dw.data(), bias, qkv.data(), cuda::OutMode::store_bf16, cs.m, n, cs.k, nullptr);
        if (by_slot)
          cuda::rope_qkv_slots(qkv.data(), dpos.data(), dslots.data(), cs.m, dinv.data(), d, cs.interleaved, cs.heads,
                               cs.kv_heads, d, q_want.data(), want.kv, nullptr, table.data(), table_positions);
        else
          cuda::rope_qkv(qkv.data(), dpos.data(), nullptr, cs.m, dinv.data(), d, cs.interleaved, cs.heads,
                         cs.kv_heads, d, q_want.data(), want.kv, nullptr, table.data(), table_positions);

        // The fused GEMM.
        Cache got(f, by_slot, n_slots, cs.kv_heads, d);
        DeviceBuffer<bf16> q_got(q_want.size());
        q_got.zero();
        const cuda::RopeKvTarget target{dpos.data(), slot_ptr, dinv.data(), table.data(), table_positions, d,
                                        cs.interleaved, cs.heads, cs.kv_heads, d, q_got.data(), got.kv, {}};
        // The fused GEMM runs where the plain one takes the 128x256 staged tiles (config 4): on a
        // 132-SM Hopper (H100 SXM, H200) at these shapes; another SM count may plan other tiles.
        if (cuda::gemm_wgmma_persistent_plan(cs.m, n, cs.k) != 4) {
          EXPECT_FALSE(cuda::gemm_rope_kv_ok(dx.data(), dw.data(), cs.m, cs.k, target));
          continue;
        }
        ASSERT_TRUE(cuda::gemm_rope_kv_ok(dx.data(), dw.data(), cs.m, cs.k, target));
        ASSERT_TRUE(cuda::gemm_rope_kv(dx.data(), dw.data(), bias, target, cs.m, cs.k, nullptr));
        cuda::cuda_synchronize();

        EXPECT_EQ(Cache::bytes(q_got), Cache::bytes(q_want)) << "q";
        const auto g = got.contents(), w = want.contents();
        for (size_t i = 0; i < g.size(); ++i)
          EXPECT_EQ(g[i], w[i]) << "cache buffer " << i << " (K, V, K scales, V scales)";
      }
  }
}

// Where the plan would not run the staged 128x256 tiles (small M), or the shape does not fit the
// epilogue (a q width that is no multiple of 256, partial rotation), gemm_rope_kv declines and
// launches nothing.
TEST(GpuMatmul, GemmRopeDeclinesWhatItCannotTake) {
  KILN_REQUIRE_GPU();
  if (!gemm_version_testable(5)) GTEST_SKIP() << "the RoPE epilogue is a wgmma kernel (sm_90a)";
  const int64_t k = 256;
  auto dx = to_device_bf16(random_bf16_values(size_t(4096 * k), 61));
  auto dw = to_device_bf16(random_bf16_values(size_t(6144 * k), 62));
  DeviceBuffer<int32_t> dpos(std::vector<int32_t>(4096, 0)), dslots(std::vector<int32_t>(4096, 0));
  DeviceBuffer<float> dinv(std::vector<float>(64, 1.0f));
  DeviceBuffer<bf16> q(size_t(4096 * 4096)), kc(size_t(4096 * 1024)), vc(kc.size());
  const cuda::KvLayout kv{kc.data(), vc.data(), 0, 1024, 128};
  const cuda::RopeKvTarget ok{dpos.data(), dslots.data(), dinv.data(), nullptr, 0, 128, false, 32, 8, 128,
                              q.data(), kv, {}};
  // Config 4 at M = 2048 on a 132-SM Hopper; the declines below hold on any device.
  if (cuda::gemm_wgmma_persistent_plan(2048, 6144, k) == 4) {
    EXPECT_TRUE(cuda::gemm_rope_kv_ok(dx.data(), dw.data(), 2048, k, ok));
  }
  EXPECT_FALSE(cuda::gemm_rope_kv_ok(dx.data(), dw.data(), 200, k, ok)) << "split-K rows";
  EXPECT_FALSE(cuda::gemm_rope_kv_ok(dx.data(), dw.data(), 512, k, ok)) << "another tile shape";
  cuda::RopeKvTarget partial = ok;
  partial.rot_dim = 64;
  EXPECT_FALSE(cuda::gemm_rope_kv_ok(dx.data(), dw.data(), 2048, k, partial)) << "partial rotation";
  cuda::RopeKvTarget narrow = ok;
  narrow.n_heads = 31;  // q_dim 3968
  EXPECT_FALSE(cuda::gemm_rope_kv_ok(dx.data(), dw.data(), 2048, k, narrow)) << "q_dim % 256";
}

}  // namespace
}  // namespace kiln::gputest
