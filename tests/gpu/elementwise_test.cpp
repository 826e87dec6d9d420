// Embedding gather, (fused add +) RMSNorm, RoPE with the cache write, SwiGLU against the CPU ops.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/elementwise.h"

namespace kiln::gputest {
namespace {

TEST(GpuElementwise, EmbedGather) {
  KILN_REQUIRE_GPU();
  const int64_t vocab = 101, hidden = 72, n = 37;
  auto table = random_bf16_values(size_t(vocab * hidden), 5);
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 37 + 11) % vocab);
  auto dt = to_device_bf16(table);
  DeviceBuffer<int32_t> dtok(tokens);
  DeviceBuffer<float> out(size_t(n * hidden));
  out.poison();
  cuda::embed_gather(dt.data(), dtok.data(), out.data(), n, hidden, nullptr);
  auto got = out.to_host();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < hidden; ++j)
      ASSERT_EQ(got[size_t(i * hidden + j)], table[size_t(tokens[size_t(i)] * hidden + j)]);
}

TEST(GpuElementwise, RmsNormWithAndWithoutResidualAdd) {
  KILN_REQUIRE_GPU();
  // 1001: the scalar path; the others the float4 path (without the residual add).
  for (int64_t dim : {64, 576, 1000, 1001, 4096}) {
    for (bool add : {false, true}) {
      const int64_t rows = 3;
      auto x = random_bf16_values(size_t(rows * dim), 6, 3.0f);
      auto delta = random_bf16_values(size_t(rows * dim), 7);
      auto w = random_bf16_values(size_t(dim), 8);
      std::vector<float> sum = x, ref(x.size());
      if (add)
        for (size_t i = 0; i < x.size(); ++i) sum[i] += delta[i];
      cpu::rmsnorm(sum.data(), w.data(), ref.data(), rows, dim, 1e-5f);
      DeviceBuffer<float> dx(x), dd(delta);
      auto dw = to_device_bf16(w);
      DeviceBuffer<bf16> out(x.size());
      out.poison();
      cuda::rmsnorm(dx.data(), add ? dd.data() : nullptr, dw.data(), out.data(), rows, dim, 1e-5f, nullptr);
      EXPECT_LT(rel_error(from_device_bf16(out), ref), kTolBf16Out) << "dim " << dim << " add " << add;
      EXPECT_LT(rel_error(dx.to_host(), sum), 1e-6) << "residual written back, dim " << dim;
    }
  }
}

// Batch invariance of the norm: row r of a 300-row call has the bits of the same row normalized
// alone, at every dim of the one-pass path (4096: 32 warps of the block; 3584: 28; 576: 5; 64 and
// 200: 4, partly empty). Written for a warp-per-row kernel for many rows (session 10, commit
// 02a676a: same bits, but slower at 2048 rows; removed); any such kernel must keep this. Since
// session 11 the 300 rows take the 256-thread kernel (rmsnorm_wide_kernel, from 17 rows) and the
// single rows the one-pass kernel: this is the test that the wide kernel replays its sum.
TEST(GpuElementwise, RmsNormManyRowsSameBitsAsOneRow) {
  KILN_REQUIRE_GPU();
  for (int64_t dim : {64, 200, 576, 3584, 4096}) {
    const int64_t rows = 300;
    auto x = random_bf16_values(size_t(rows * dim), 31, 3.0f);
    auto w = random_bf16_values(size_t(dim), 32);
    DeviceBuffer<float> dx(x);
    auto dw = to_device_bf16(w);
    DeviceBuffer<bf16> all(x.size()), one(x.size());
    all.poison();
    one.poison();
    cuda::rmsnorm(dx.data(), nullptr, dw.data(), all.data(), rows, dim, 1e-5f, nullptr);
    for (int64_t r = 0; r < rows; ++r)
      cuda::rmsnorm(dx.data() + r * dim, nullptr, dw.data(), one.data() + r * dim, 1, dim, 1e-5f, nullptr);
    const auto a = from_device_bf16(all), b = from_device_bf16(one);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "dim " << dim;
    std::vector<float> ref(x.size());
    cpu::rmsnorm(x.data(), w.data(), ref.data(), rows, dim, 1e-5f);
    EXPECT_LT(rel_error(a, ref), kTolBf16Out) << "dim " << dim;
  }
}

TEST(GpuElementwise, RopeQkvBothStylesLlama3ScalingGqa) {
  KILN_REQUIRE_GPU();
  struct Case {
    int heads, kv_heads, head_dim;
    RopeStyle style;
    float llama3;
  };
  for (Case cs : {Case{4, 4, 64, RopeStyle::half, 0}, Case{8, 2, 128, RopeStyle::interleaved, 8.0f},
                  Case{7, 1, 80, RopeStyle::half, 0}, Case{4, 1, 96, RopeStyle::interleaved, 0}}) {
    SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.head_dim);
    RopeConfig rc;
    rc.theta = 500000.0f;
    rc.rot_dim = cs.head_dim;
    rc.style = cs.style;
    rc.llama3_factor = cs.llama3;
    const int64_t n = 37, start = 1000, capacity = 1100;
    const int64_t q_dim = cs.heads * cs.head_dim, kv_dim = cs.kv_heads * cs.head_dim, row = q_dim + 2 * kv_dim;
    auto qkv = random_bf16_values(size_t(n * row), 9);
    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(start + i * 3);  // any positions, not only consecutive
    std::vector<float> q(size_t(n * q_dim)), k(size_t(n * kv_dim)), v(size_t(n * kv_dim));
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(qkv.begin() + t * row, q_dim, q.begin() + t * q_dim);
      std::copy_n(qkv.begin() + t * row + q_dim, kv_dim, k.begin() + t * kv_dim);
      std::copy_n(qkv.begin() + t * row + q_dim + kv_dim, kv_dim, v.begin() + t * kv_dim);
    }
    cpu::rope(q.data(), pos.data(), n, cs.heads, cs.head_dim, rc);
    cpu::rope(k.data(), pos.data(), n, cs.kv_heads, cs.head_dim, rc);
    std::vector<float> inv(size_t(cs.head_dim / 2));
    for (int i = 0; i < cs.head_dim / 2; ++i) inv[size_t(i)] = cpu::rope_inv_freq(rc, i);

    auto dqkv = to_device_bf16(qkv);
    DeviceBuffer<int32_t> dpos(pos);
    DeviceBuffer<float> dinv(inv);
    DeviceBuffer<bf16> dq(q.size()), kc(size_t((start + 3 * n) * kv_dim)), vc(kc.size());
    dq.poison();
    kc.poison();
    vc.poison();
    cuda::KvLayout kv{kc.data(), vc.data(), 0, kv_dim, cs.head_dim};
    cuda::rope_qkv(dqkv.data(), dpos.data(), nullptr, n, dinv.data(), cs.head_dim, cs.style == RopeStyle::interleaved,
                   cs.heads, cs.kv_heads, cs.head_dim, dq.data(), kv, nullptr);
    EXPECT_LT(rel_error(from_device_bf16(dq), q), kTolBf16Out);
    auto kh = from_device_bf16(kc), vh = from_device_bf16(vc);
    std::vector<float> kgot, vgot;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < kv_dim; ++j) {
        kgot.push_back(kh[size_t(pos[size_t(t)] * kv_dim + j)]);
        vgot.push_back(vh[size_t(pos[size_t(t)] * kv_dim + j)]);
      }
    EXPECT_LT(rel_error(kgot, k), kTolBf16Out);
    EXPECT_EQ(rel_error(vgot, v), 0.0) << "v is copied exactly";
    (void)capacity;

    // With the (cos, sin) table the backend keeps (rope_table_fill): the same bits, for positions
    // inside the table (start .. start + 57) and past its end (computed).
    const int64_t table_positions = start + 58;
    DeviceBuffer<float2> table(size_t(table_positions * (cs.head_dim / 2)));
    cuda::rope_table_fill(table.data(), table_positions, dinv.data(), cs.head_dim, nullptr);
    DeviceBuffer<bf16> dq2(q.size()), kc2(kc.size()), vc2(vc.size());
    dq2.poison();
    kc2.poison();
    vc2.poison();
    cuda::KvLayout kv2{kc2.data(), vc2.data(), 0, kv_dim, cs.head_dim};
    cuda::rope_qkv(dqkv.data(), dpos.data(), nullptr, n, dinv.data(), cs.head_dim, cs.style == RopeStyle::interleaved,
                   cs.heads, cs.kv_heads, cs.head_dim, dq2.data(), kv2, nullptr, table.data(), table_positions);
    EXPECT_EQ(from_device_bf16(dq2), from_device_bf16(dq)) << "q with the angle table";
    auto kh2 = from_device_bf16(kc2);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < kv_dim; ++j)
        ASSERT_EQ(kh2[size_t(pos[size_t(t)] * kv_dim + j)], kh[size_t(pos[size_t(t)] * kv_dim + j)]) << "k, token " << t;
  }
}

TEST(GpuElementwise, SiluMul) {
  KILN_REQUIRE_GPU();
  // 1037: the one-element-per-thread path; 1024 and 136: eight columns per thread.
  for (int64_t inter : {1037, 1024, 136}) {
    const int64_t rows = 3;
    auto gu = random_bf16_values(size_t(rows * 2 * inter), 10, 4.0f);
    std::vector<float> g(size_t(rows * inter)), u(g.size()), ref(g.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < inter; ++i) {
        g[size_t(r * inter + i)] = gu[size_t(r * 2 * inter + i)];
        u[size_t(r * inter + i)] = gu[size_t(r * 2 * inter + inter + i)];
      }
    cpu::silu_mul(g.data(), u.data(), ref.data(), rows * inter);
    auto d = to_device_bf16(gu);
    DeviceBuffer<bf16> out(ref.size());
    out.poison();
    cuda::silu_mul(d.data(), out.data(), rows, inter, nullptr);
    EXPECT_LT(rel_error(from_device_bf16(out), ref), kTolBf16Out) << "inter " << inter;
  }
}

// The vectorized RoPE kernel against the per-token one: `launch(t0, m, q_out, kv)` writes tokens
// t0 .. t0 + m - 1; run as one call of all n tokens (vectorized from 64 on) and as 37-token pieces
// (the per-token kernel) into fresh poisoned buffers of q_elems / kv_elems, q, k and v must match
// bit for bit. make_kv(k, v) builds the cache layout over the two buffers.
template <class MakeKv, class Launch>
void expect_one_call_equals_pieces(int64_t n, int64_t q_elems, int64_t kv_elems, MakeKv&& make_kv, Launch&& launch) {
  std::vector<float> got[2][3];  // (one call, pieces) x (q, k, v)
  for (int way = 0; way < 2; ++way) {
    const auto q_size = static_cast<size_t>(q_elems), kv_size = static_cast<size_t>(kv_elems);
    DeviceBuffer<bf16> dq(q_size), kc(kv_size), vc(kv_size);
    dq.poison();
    kc.poison();
    vc.poison();
    const cuda::KvLayout kv = make_kv(kc.data(), vc.data());
    const int64_t piece = way == 0 ? n : 37;
    for (int64_t t0 = 0; t0 < n; t0 += piece) launch(t0, std::min(piece, n - t0), dq.data(), kv);
    got[way][0] = from_device_bf16(dq);
    got[way][1] = from_device_bf16(kc);
    got[way][2] = from_device_bf16(vc);
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(0, std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * sizeof(float)))
        << "q, k, v"[size_t(3 * i)];
}

// rope_qkv_slots on a batched step (n >= 64 tokens, full-width rotation) takes the vectorized
// kernel; below 64 tokens the per-token one. The same tokens through both (one call of 300 tokens
// vs calls of 37 / 64-token pieces) must write the same bits to q and to the slot-mapped K/V.
TEST(GpuElementwise, RopeQkvSlotsVectorizedEqualsPerTokenKernel) {
  KILN_REQUIRE_GPU();
  for (bool interleaved : {false, true})
    for (int head_dim : {64, 128}) {
      SCOPED_TRACE(testing::Message() << "interleaved " << interleaved << " d " << head_dim);
      const int heads = 8, kv_heads = 2;
      const int64_t n = 300, n_slots = 512, q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
      const int64_t row = q_dim + 2 * kv_dim;
      auto dqkv = to_device_bf16(random_bf16_values(size_t(n * row), 19));
      std::vector<int32_t> pos(n), slots(n);
      for (int64_t i = 0; i < n; ++i) {
        pos[size_t(i)] = int32_t(7 * i % 1500);
        slots[size_t(i)] = int32_t((i * 131 + 5) % n_slots);  // distinct: 131 is odd, n_slots a power of 2
      }
      std::vector<float> inv(size_t(head_dim / 2));
      for (int i = 0; i < head_dim / 2; ++i) inv[size_t(i)] = std::pow(500000.0f, -2.0f * float(i) / float(head_dim));
      DeviceBuffer<int32_t> dpos(pos), dslots(slots);
      DeviceBuffer<float> dinv(inv);
      DeviceBuffer<float2> table(size_t(1000 * head_dim / 2));  // positions past 1000 computed
      cuda::rope_table_fill(table.data(), 1000, dinv.data(), head_dim, nullptr);
      expect_one_call_equals_pieces(
          n, n * q_dim, n_slots * kv_dim,
          [&](bf16* k, bf16* v) { return cuda::KvLayout{k, v, 0, kv_dim, head_dim}; },
          [&](int64_t t0, int64_t m, bf16* q_out, const cuda::KvLayout& kv) {
            cuda::rope_qkv_slots(dqkv.data() + t0 * row, dpos.data() + t0, dslots.data() + t0, m, dinv.data(),
                                 head_dim, interleaved, heads, kv_heads, head_dim, q_out + t0 * q_dim, kv, nullptr,
                                 table.data(), 1000);
          });
    }
}

// rope_qkv (a contiguous cache: a prompt's prefill chunk) takes the same vectorized kernel from 64
// tokens on: 300 tokens in one call vs 37-token pieces (the per-token kernel) write the same bits
// to q and to K/V at (sequence, position), for two sequences (seq_ids, seq_stride) and for one
// (seq_ids null: the prefill path's call).
TEST(GpuElementwise, RopeQkvContiguousVectorizedEqualsPerTokenKernel) {
  KILN_REQUIRE_GPU();
  for (bool two_seqs : {true, false})
    for (bool interleaved : {false, true})
      for (int head_dim : {64, 128}) {
        SCOPED_TRACE(testing::Message() << "two sequences " << two_seqs << " interleaved " << interleaved << " d "
                                        << head_dim);
        const int heads = 8, kv_heads = 2;
        const int64_t n = 300, capacity = 1600, q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
        const int64_t row = q_dim + 2 * kv_dim;
        auto dqkv = to_device_bf16(random_bf16_values(size_t(n * row), 23));
        std::vector<int32_t> pos(n), seq(n);
        for (int64_t i = 0; i < n; ++i) {
          seq[size_t(i)] = two_seqs ? int32_t(i % 2) : 0;
          pos[size_t(i)] = two_seqs ? int32_t(5 * (i / 2) + 3) : int32_t(3 * i + 1);  // distinct, some past the table
        }
        std::vector<float> inv(size_t(head_dim / 2));
        for (int i = 0; i < head_dim / 2; ++i) inv[size_t(i)] = std::pow(500000.0f, -2.0f * float(i) / float(head_dim));
        DeviceBuffer<int32_t> dpos(pos), dseq(seq);
        DeviceBuffer<float> dinv(inv);
        DeviceBuffer<float2> table(size_t(500 * head_dim / 2));
        cuda::rope_table_fill(table.data(), 500, dinv.data(), head_dim, nullptr);
        expect_one_call_equals_pieces(
            n, n * q_dim, 2 * capacity * kv_dim,
            [&](bf16* k, bf16* v) { return cuda::KvLayout{k, v, capacity * kv_dim, kv_dim, head_dim}; },
            [&](int64_t t0, int64_t m, bf16* q_out, const cuda::KvLayout& kv) {
              const int32_t* seqs = two_seqs ? dseq.data() + t0 : nullptr;
              cuda::rope_qkv(dqkv.data() + t0 * row, dpos.data() + t0, seqs, m, dinv.data(), head_dim, interleaved,
                             heads, kv_heads, head_dim, q_out + t0 * q_dim, kv, nullptr, table.data(), 500);
            });
      }
}

}  // namespace
}  // namespace kiln::gputest
