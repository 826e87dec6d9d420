// The wgmma varlen prefill (attention_prefill_varlen_wgmma): many chunks' 64-row query tiles in one
// launch over contiguous K/V rows, as a quantized pool's mixed step runs them on its compact bf16
// copy. Each chunk must get exactly what a version 3 launch of that chunk alone gives (the same
// tiles, the same wgmma math: bit for bit), and what cpu::attention gives within bf16 tolerance.
// Chunks sit on both sides of the 64-row query tile and the 128-position K/V tile, start at
// positions other than 0 (chunked prefill), and are packed with gaps (the copy's block rounding),
// so a K/V box past a sequence's end reads the next sequence's rows, which the mask must hide.
#include <algorithm>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/attention.h"

namespace kiln::gputest {
namespace {

struct Case {
  int heads, kv_heads, d;
};

TEST(GpuPrefillVarlenWgmma, EqualsPerChunkVersion3AndTheCpu) {
  KILN_REQUIRE_GPU();
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{128, 0}, {1, 0},  {65, 63}, {3, 190},
                                                           {200, 17}, {64, 0}, {56, 0},  {129, 300}};
  for (Case cs : {Case{8, 2, 64}, Case{32, 8, 128}, Case{7, 1, 128}}) {
    SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d);
    const int64_t kv_dim = int64_t(cs.kv_heads) * cs.d, q_row = int64_t(cs.heads) * cs.d;
    std::vector<int64_t> row0, kv_row0;
    int64_t M = 0, kv_rows = 0;
    for (auto [n_q, q_start] : chunks) {
      row0.push_back(M);
      kv_row0.push_back(kv_rows);
      M += n_q;
      kv_rows += (n_q + q_start + 15) / 16 * 16;  // whole 16-position blocks, as the compact copy
    }
    const auto q = random_bf16_values(size_t(M * q_row), 81, 2.0f);
    const auto k = random_bf16_values(size_t(kv_rows * kv_dim), 82, 2.0f);
    const auto v = random_bf16_values(size_t(kv_rows * kv_dim), 83);
    auto dq = to_device_bf16(q), dk = to_device_bf16(k), dv = to_device_bf16(v);
    const cuda::KvLayout kv{dk.data(), dv.data(), 0, kv_dim, cs.d};
    DeviceBuffer<bf16> out_chunks(size_t(M * q_row)), out_varlen(size_t(M * q_row));
    out_chunks.poison();
    out_varlen.poison();
    if (!cuda::attention_prefill_wgmma_ok(dq.data(), kv, out_varlen.data(), cs.d))
      GTEST_SKIP() << "the wgmma prefill needs sm_90a";

    std::vector<cuda::PrefillTile> tiles;
    std::vector<float> ref(q.size());
    for (size_t j = 0; j < chunks.size(); ++j) {
      const auto [n_q, q_start] = chunks[j];
      const cuda::KvLayout seq{dk.data() + kv_row0[j] * kv_dim, dv.data() + kv_row0[j] * kv_dim, 0, kv_dim, cs.d};
      ASSERT_TRUE(cuda::attention_prefill_version(3, dq.data() + row0[j] * q_row, seq,
                                                  out_chunks.data() + row0[j] * q_row, n_q, q_start, cs.heads,
                                                  cs.kv_heads, cs.d, nullptr));
      for (int64_t q0 = 0; q0 < n_q; q0 += cuda::kPrefillTileRows) {
        cuda::PrefillTile t{int32_t(row0[j] + q0), int32_t(n_q - q0), int32_t(q_start + q0), {0}};
        t.kv_row0 = int32_t(kv_row0[j]);
        tiles.push_back(t);
      }
      const int64_t len = n_q + q_start;
      const std::vector<float> kb(k.begin() + kv_row0[j] * kv_dim, k.begin() + (kv_row0[j] + len) * kv_dim);
      const std::vector<float> vb(v.begin() + kv_row0[j] * kv_dim, v.begin() + (kv_row0[j] + len) * kv_dim);
      cpu::attention(q.data() + row0[j] * q_row, kb.data(), vb.data(), ref.data() + row0[j] * q_row, n_q, q_start,
                     cs.heads, cs.kv_heads, cs.d);
    }
    std::reverse(tiles.begin(), tiles.end());  // any order
    DeviceBuffer<int32_t> dtiles(
        std::span<const int32_t>(reinterpret_cast<const int32_t*>(tiles.data()), 4 * tiles.size()));
    ASSERT_TRUE(cuda::attention_prefill_varlen_wgmma(dq.data(), M, kv, kv_rows, out_varlen.data(),
                                                     reinterpret_cast<const cuda::PrefillTile*>(dtiles.data()),
                                                     int64_t(tiles.size()), cs.heads, cs.kv_heads, cs.d, nullptr));
    const auto got = from_device_bf16(out_varlen);
    EXPECT_EQ(got, from_device_bf16(out_chunks));
    EXPECT_LT(rel_error(got, ref), kTolBf16Out);
  }
}

TEST(GpuPrefillVarlenWgmma, DeclinesWhatItCannotRun) {
  KILN_REQUIRE_GPU();
  auto dq = to_device_bf16(random_bf16_values(size_t(64 * 8 * 128), 91));
  DeviceBuffer<bf16> kv_rows(size_t(64 * 2 * 128)), out(size_t(64 * 8 * 128));
  const cuda::KvLayout kv{kv_rows.data(), kv_rows.data(), 0, 2 * 128, 128};
  if (!cuda::attention_prefill_wgmma_ok(dq.data(), kv, out.data(), 128)) GTEST_SKIP() << "needs sm_90a";
  cuda::KvLayout paged = kv;
  const int32_t* any_table = reinterpret_cast<const int32_t*>(kv_rows.data());
  paged.block_table = any_table, paged.bt_stride = 4, paged.block_shift = 4;
  EXPECT_FALSE(cuda::attention_prefill_wgmma_ok(dq.data(), paged, out.data(), 128));
  EXPECT_FALSE(cuda::attention_prefill_wgmma_ok(dq.data() + 1, kv, out.data(), 128));  // unaligned q
  EXPECT_FALSE(cuda::attention_prefill_wgmma_ok(dq.data(), kv, out.data(), 96));      // head_dim
  const cuda::PrefillTile* no_tiles = nullptr;
  EXPECT_FALSE(cuda::attention_prefill_varlen_wgmma(dq.data(), 64, paged, 64, out.data(), no_tiles, 1, 8, 2, 128,
                                                    nullptr));
}

}  // namespace
}  // namespace kiln::gputest
