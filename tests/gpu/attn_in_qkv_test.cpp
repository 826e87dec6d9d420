// The batch-1 attention run inside the fused int8 / int4 qkv GEMV (kernels/cuda/attn_in_qkv.h)
// against the two kernels it replaces (qgemv_rope_kv, then attention_decode): the same q, the same
// K/V written into the cache and the same attention output, bit for bit (it runs the streaming
// decode kernel's tiles and merge), on random caches of 1 .. 256 positions (tile edges, the newest
// position in every tile) and three head layouts: Llama-3-8B's (32 / 8 heads, hidden 4096), a group
// of 7 (Qwen2.5-7B's 28 / 4 heads, hidden 3584) and plain multi-head attention (group 1). Each
// fused launch runs twice: its per-head counters must be back at zero for the second.
// Then the backend with KILN_ATTN_IN_QKV against the same backend without it: the same logits bits
// through captured graphs and a profiled step.
#include <fmt/core.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_weight.h"
#include "fused_decode_test_util.h"
#include "gpu_test_models.h"
#include "gpu_test_util.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attn_in_qkv.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "quant_test_util.h"

namespace kiln::gputest {
namespace {

struct Shape {
  int heads, kv_heads;
};

struct Format {
  QuantFormat format;
  int64_t group;  // 0: per channel
};

void check(Format f, Shape s, int len, int64_t capacity, uint32_t seed) {
  SCOPED_TRACE(fmt::format("{} heads {} / {}, {} positions, capacity {}", f.format == QuantFormat::int4 ? "int4" : "int8",
                           s.heads, s.kv_heads, len, capacity));
  constexpr int d = 128;
  const int64_t q_dim = int64_t(s.heads) * d, kv_dim = int64_t(s.kv_heads) * d, rows = q_dim + 2 * kv_dim;
  const int64_t hidden = q_dim;
  HostMatrix w = random_quantized(f.format, rows, hidden, f.group ? f.group : hidden, seed, 0.05f);
  cuda::DeviceWeight dw = cuda::upload_weight({&w});
  ASSERT_TRUE(cuda::qgemv_fusable(dw.view()));
  auto dx = to_device_bf16(random_bf16_values(size_t(hidden), seed + 1));
  const std::vector<float> k0 = random_bf16_values(size_t(capacity * kv_dim), seed + 2, 2.0f);
  const std::vector<float> v0 = random_bf16_values(size_t(capacity * kv_dim), seed + 3);
  std::vector<float> inv(size_t(d / 2));
  for (int i = 0; i < d / 2; ++i) inv[size_t(i)] = std::pow(500000.0f, -2.0f * float(i) / float(d));
  DeviceBuffer<float> dinv(inv);
  DeviceBuffer<int32_t> dpos(std::vector<int32_t>{len - 1}), dlen(std::vector<int32_t>{len});

  struct Out {
    std::vector<float> q, k, v, attn;
  };
  auto run = [&](bool fused, DeviceBuffer<uint32_t>* counters, int times) {
    auto dk = to_device_bf16(k0), dv = to_device_bf16(v0);
    DeviceBuffer<bf16> dq(static_cast<size_t>(q_dim)), dattn(static_cast<size_t>(q_dim));
    dq.poison();
    dattn.poison();
    cuda::KvLayout kv{dk.data(), dv.data(), capacity * kv_dim, kv_dim, d};
    cuda::RopeKvTarget t;
    t.position = dpos.data();
    t.inv_freq = dinv.data();
    t.rot_dim = d;
    t.n_heads = s.heads;
    t.n_kv_heads = s.kv_heads;
    t.head_dim = d;
    t.q_out = dq.data();
    t.kv = kv;
    for (int i = 0; i < times; ++i) {
      if (fused) {
        EXPECT_TRUE(cuda::attn_in_qkv_applies(s.heads, s.kv_heads, d, kv, capacity));
        const cuda::AttnInQkv a{dlen.data(), dattn.data(), counters->data()};
        cuda::qgemv_rope_kv(dx.data(), dw.view(), nullptr, t, nullptr, {}, &a);
      } else {
        cuda::qgemv_rope_kv(dx.data(), dw.view(), nullptr, t, nullptr);
        DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(1, s.heads, d, capacity)));
        cuda::attention_decode(dq.data(), kv, dlen.data(), capacity, dattn.data(),
                               cuda::decode_workspace(ws.data(), 1, s.heads, d, capacity), 1, s.heads, s.kv_heads, d,
                               nullptr);
      }
    }
    cuda::cuda_synchronize();
    return Out{from_device_bf16(dq), from_device_bf16(dk), from_device_bf16(dv), from_device_bf16(dattn)};
  };
  DeviceBuffer<uint32_t> counters(std::vector<uint32_t>(size_t(cuda::attn_in_qkv_counters(s.kv_heads)), 0u));
  const Out want = run(false, nullptr, 1), once = run(true, &counters, 1), twice = run(true, &counters, 2);
  EXPECT_EQ(want.q, once.q);
  EXPECT_EQ(want.k, once.k);
  EXPECT_EQ(want.v, once.v);
  EXPECT_EQ(want.attn, once.attn) << "attention output: " << rel_error(once.attn, want.attn) << " apart";
  EXPECT_EQ(once.attn, twice.attn) << "the second launch (counters not back at zero?)";
  EXPECT_EQ(std::vector<uint32_t>(counters.size(), 0u), counters.to_host());
}

TEST(GpuAttnInQkv, MatchesSeparateKernelsBitForBit) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 4900;
  for (Format f : {Format{QuantFormat::int4, 128}, Format{QuantFormat::int8, 0}}) {
    for (int len : {1, 2, 17, 63, 64, 65, 127, 128, 129, 192, 193, 255, 256}) check(f, Shape{32, 8}, len, 256, seed += 10);
    for (int len : {1, 64, 129, 200}) check(f, Shape{28, 4}, len, 200, seed += 10);
    for (int len : {5, 70}) check(f, Shape{8, 8}, len, 129, seed += 10);
  }
  check(Format{QuantFormat::int4, 32}, Shape{32, 8}, 100, 128, seed += 10);  // groups of 32
}

TEST(GpuAttnInQkv, RefusesWhatItDoesNotTake) {
  KILN_REQUIRE_GPU();
  DeviceBuffer<bf16> k(size_t(300 * 1024)), v(size_t(300 * 1024));
  const cuda::KvLayout kv{k.data(), v.data(), 300 * 1024, 1024, 128};
  EXPECT_TRUE(cuda::attn_in_qkv_applies(32, 8, 128, kv, 256));
  EXPECT_FALSE(cuda::attn_in_qkv_applies(32, 8, 128, kv, 257));  // longer caches: the separate kernels
  EXPECT_FALSE(cuda::attn_in_qkv_applies(72, 8, 128, kv, 128));  // a group of 8 at most
  EXPECT_FALSE(cuda::attn_in_qkv_applies(16, 4, 64, kv, 128));   // head_dim 64
  cuda::KvLayout quantized = kv;
  quantized.quant = cuda::KvQuant::int8;
  EXPECT_FALSE(cuda::attn_in_qkv_applies(32, 8, 128, quantized, 128));
}

// The backend: Llama-3's head layout at hidden 1024, int8 and int4 projections; a prompt past one
// attention tile, then decode steps up to 200 positions, with the attention in the qkv GEMV
// (KILN_ATTN_IN_QKV=1, then 2: the o GEMV released at the qkv GEMV's exit) and without: the same
// logits bits at every step, and the fused kernel ran.
TEST(GpuAttnInQkv, BackendDecodeSameBits) {
  KILN_REQUIRE_GPU();
  ModelConfig c = small_llama();
  c.hidden_size = 1024;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 128;
  c.rope.rot_dim = 128;
  c.intermediate_size = 768;
  c.vocab_size = 777;
  c.n_layers = 2;
  for (QuantFormat f : {QuantFormat::int4, QuantFormat::int8}) {
    SCOPED_TRACE(f == QuantFormat::int4 ? "int4" : "int8");
    std::unique_ptr<CudaBackend> plain = CudaBackend::random(c, 49, 0.08f, {}, f);
    for (const char* mode : {"1", "2"}) {
      SCOPED_TRACE(fmt::format("KILN_ATTN_IN_QKV={}", mode));
      setenv("KILN_ATTN_IN_QKV", mode, 1);
      std::unique_ptr<CudaBackend> fused = CudaBackend::random(c, 49, 0.08f, {}, f);
      unsetenv("KILN_ATTN_IN_QKV");
      auto sa = fused->new_sequence(200), sb = plain->new_sequence(200);
      std::vector<int32_t> prompt(70);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 131 + 7) % c.vocab_size);
      bool qkv_fused = false;
      ASSERT_NO_FATAL_FAILURE(
          decode_both_same_bits(*fused, *plain, *sa, *sb, prompt, 120, 37, 11, c.vocab_size, qkv_fused));
      bool ran = false;
      for (const KernelStat& st : fused->kernel_stats()) ran |= st.name.ends_with("qkv+rope+attention.gemv");
      EXPECT_TRUE(ran) << "the qkv GEMV with the attention did not run";
    }
  }
}

}  // namespace
}  // namespace kiln::gputest
