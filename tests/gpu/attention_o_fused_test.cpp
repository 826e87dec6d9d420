// The fused batch-1 attention + o projection (kernels/cuda/attention_o_fused.h) against the two
// kernels it replaces (attention_decode, then the int4 GEMV adding into the residual) and against
// the CPU reference, on random caches of 1 .. 256 positions (tile edges, the newest position in
// every tile, the second stage's reloads past 128) and three head layouts: Llama-3-8B's (32 / 8
// heads, hidden 4096, 128-row slices), a group of 7 with 3584 rows (Qwen2.5-7B's o: 64-row
// slices, an odd number of super-chunks a row) and plain multi-head attention (group 1).
//
// Tolerances: the separate kernels compute the same attention tiles and merge (the same bf16
// output); the products differ only in fp32 summation order: kTolF32Out. The CPU reference rounds
// its own attention to bf16, a rounding or two apart from the GPU's in some elements: kTolBf16Out.
#include <fmt/core.h>

#include <cstring>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_weight.h"
#include "gpu_test_models.h"
#include "gpu_test_util.h"
#include "model/random_weights.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_o_fused.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "quant_test_util.h"

namespace kiln::gputest {
namespace {

struct Shape {
  int heads, kv_heads;
};

void check(Shape s, int len, int64_t capacity, uint32_t seed) {
  SCOPED_TRACE(fmt::format("heads {} / {}, {} positions, capacity {}", s.heads, s.kv_heads, len, capacity));
  constexpr int d = 128;
  const int64_t hidden = int64_t(s.heads) * d, kv_dim = int64_t(s.kv_heads) * d;
  ThreadPool pool(2);
  HostMatrix wo = random_quantized(QuantFormat::int4, hidden, hidden, 128, seed, 0.05f);
  auto q = random_bf16_values(size_t(hidden), seed + 1, 2.0f);
  auto k = random_bf16_values(size_t(capacity * kv_dim), seed + 2, 2.0f);
  auto v = random_bf16_values(size_t(capacity * kv_dim), seed + 3);
  auto y0 = random_bf16_values(size_t(hidden), seed + 4);

  // CPU: the attention of the query at position len - 1, rounded to bf16, then y0 + W . attn.
  std::vector<float> attn(static_cast<size_t>(hidden)), ref(y0);
  cpu::attention(q.data(), k.data(), v.data(), attn.data(), 1, len - 1, s.heads, s.kv_heads, d);
  for (float& a : attn) a = round_to_bf16(a);
  std::vector<float> prod(static_cast<size_t>(hidden));
  cpu::matmul(pool, attn.data(), wo.data.data(), nullptr, prod.data(), 1, hidden, hidden);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += prod[i];

  cuda::DeviceWeight dw = cuda::upload_weight({&wo});
  ASSERT_EQ(int(dw.format), int(QuantFormat::int4));
  auto dq = to_device_bf16(q), dk = to_device_bf16(k), dv = to_device_bf16(v);
  DeviceBuffer<int32_t> dlen(std::vector<int32_t>{len});
  const cuda::KvLayout kv{dk.data(), dv.data(), capacity * kv_dim, kv_dim, d};
  ASSERT_TRUE(cuda::attention_o_fusable(dw.view(), s.heads, s.kv_heads, d, kv, capacity));

  // The separate kernels.
  DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(1, s.heads, d, capacity)));
  DeviceBuffer<bf16> dattn{static_cast<size_t>(hidden)};
  DeviceBuffer<float> y_sep(y0);
  cuda::attention_decode(dq.data(), kv, dlen.data(), capacity, dattn.data(),
                         cuda::decode_workspace(ws.data(), 1, s.heads, d, capacity), 1, s.heads, s.kv_heads, d,
                         nullptr);
  cuda::qmatmul(dattn.data(), dw.view(), nullptr, y_sep.data(), cuda::OutMode::add_f32, 1, nullptr);
  const std::vector<float> separate = y_sep.to_host();

  // The fused kernel, twice on fresh residuals: the same bits both times (the slices' counters
  // were zeroed again by the first launch's last blocks).
  DeviceBuffer<float> partials(size_t(cuda::attention_o_partial_floats(s.kv_heads, hidden)));
  DeviceBuffer<uint32_t> counters(std::vector<uint32_t>(size_t(cuda::attention_o_counters(hidden)), 0u));
  partials.poison();
  auto fused = [&] {
    DeviceBuffer<float> y(y0);
    cuda::attention_o_fused(dq.data(), kv, dlen.data(), dw.view(), y.data(), {partials.data(), counters.data()},
                            s.heads, s.kv_heads, d, nullptr);
    return y.to_host();
  };
  const std::vector<float> out = fused(), again = fused();
  EXPECT_LT(rel_error(out, separate), kTolF32Out);
  // The products alone (the residual taken off both): summation order should leave ~1e-6 here; the
  // backend test below sees logits further apart than that predicts (session 29), so print it.
  std::vector<float> p_fused(out), p_separate(separate);
  for (size_t i = 0; i < y0.size(); ++i) p_fused[i] -= y0[i], p_separate[i] -= y0[i];
  const double products = rel_error(p_fused, p_separate);
  EXPECT_LT(products, 1e-3);
  if (len == 65 || len == 200) std::printf("[ attn+o   ] %d positions: products %.2e apart\n", len, products);
  EXPECT_LT(rel_error(out, ref), kTolBf16Out);
  EXPECT_EQ(0, std::memcmp(out.data(), again.data(), out.size() * sizeof(float)));
}

TEST(GpuAttentionOFused, MatchesSeparateKernels) {
  KILN_REQUIRE_GPU();
  uint32_t seed = 2900;
  for (int len : {1, 2, 17, 63, 64, 65, 100, 127, 128, 129, 191, 192, 193, 255, 256})
    check(Shape{32, 8}, len, 256, seed += 10);
  for (int len : {1, 64, 129, 200}) check(Shape{28, 4}, len, 200, seed += 10);
  for (int len : {5, 70}) check(Shape{16, 16}, len, 129, seed += 10);
}

TEST(GpuAttentionOFused, RefusesWhatItDoesNotTake) {
  KILN_REQUIRE_GPU();
  HostMatrix w128 = random_quantized(QuantFormat::int4, 4096, 4096, 128, 1);
  HostMatrix w32 = random_quantized(QuantFormat::int4, 4096, 4096, 32, 2);
  cuda::DeviceWeight d128 = cuda::upload_weight({&w128}), d32 = cuda::upload_weight({&w32});
  DeviceBuffer<bf16> k(size_t(300 * 1024)), v(size_t(300 * 1024));
  const cuda::KvLayout kv{k.data(), v.data(), 300 * 1024, 1024, 128};
  EXPECT_TRUE(cuda::attention_o_fusable(d128.view(), 32, 8, 128, kv, 256));
  EXPECT_FALSE(cuda::attention_o_fusable(d128.view(), 32, 8, 128, kv, 257));  // longer caches: the separate kernels
  EXPECT_FALSE(cuda::attention_o_fusable(d32.view(), 32, 8, 128, kv, 128));   // groups of 32
  EXPECT_FALSE(cuda::attention_o_fusable(d128.view(), 64, 8, 64, kv, 128));   // head_dim 64
  cuda::KvLayout quantized = kv;
  quantized.quant = cuda::KvQuant::int8;
  EXPECT_FALSE(cuda::attention_o_fusable(d128.view(), 32, 8, 128, quantized, 128));
}

// In the backend (KILN_ATTN_O_FUSED=1): a small model of Llama-3's head layout with random int4
// o weights in groups of 128 decodes within kTolLogits of the CPU backend (the bar every GPU path
// meets: bf16 activations between kernels against fp32 on the CPU), through the captured graphs and
// the profiled (ungraphed) step, and the fused kernel did run. Its logits against the separate
// kernels' are printed beside those of another correct summation order (a 300-position cache:
// folded norms, split attention). Session 30 (H100): the products 0 and 7.9e-7 apart (kernel test),
// the logits 0.0065 apart fused and 0.0107 in the other order. This small model turns any fp32
// difference into bf16 rounding flips between its kernels (in fp32 alone it moves the logits ~2.5x
// a relative change of the o weights: a CPU experiment), so both sit at that noise, not at a bug.
TEST(GpuAttentionOFused, BackendDecodeMatchesCpu) {
  KILN_REQUIRE_GPU();
  constexpr double kTolLogits = 3e-2;  // as quant_backend_test.cpp's
  ModelConfig c = small_llama();
  c.hidden_size = 1024;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 128;
  c.rope.rot_dim = 128;
  c.intermediate_size = 1024;
  ModelWeights w = random_weights(c, 29, 0.08f);
  for (LayerWeights& L : w.layers) L.wo = random_quantized(QuantFormat::int4, L.wo.rows, L.wo.cols, 128, 31, 0.03f);
  ThreadPool pool(2);
  CpuBackend cpu(c, w, pool);
  setenv("KILN_ATTN_O_FUSED", "1", 1);
  CudaBackend fused(c, w);
  unsetenv("KILN_ATTN_O_FUSED");
  CudaBackend separate(c, w);
  auto sc = cpu.new_sequence(200), sf = fused.new_sequence(200), ss = separate.new_sequence(200);
  // Another correct summation order for scale: a cache of more than 256 positions folds the
  // RMSNorms into the GEMVs and splits the attention (a different rounding, never the fused kernel).
  auto so = separate.new_sequence(300);
  std::vector<int32_t> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 131 + 7) % c.vocab_size);
  std::vector<float> lc, lf, ls, lo;
  cpu.forward(*sc, prompt, false, lc);
  fused.forward(*sf, prompt, false, lf);
  separate.forward(*ss, prompt, false, ls);
  separate.forward(*so, prompt, false, lo);
  ASSERT_EQ(lf, ls) << "prefill (never fused)";
  double worst_vs_separate = 0, worst_other_order = 0;
  for (int step = 0; step < 12; ++step) {
    const int32_t t = int32_t((step * 29 + 5) % c.vocab_size);
    if (step == 11) fused.set_profiling(true);  // the ungraphed step
    cpu.forward(*sc, std::span<const int32_t>(&t, 1), false, lc);
    fused.forward(*sf, std::span<const int32_t>(&t, 1), false, lf);
    separate.forward(*ss, std::span<const int32_t>(&t, 1), false, ls);
    separate.forward(*so, std::span<const int32_t>(&t, 1), false, lo);
    EXPECT_LT(rel_error(lf, lc), kTolLogits) << "decode step " << step;
    worst_vs_separate = std::max(worst_vs_separate, rel_error(lf, ls));
    worst_other_order = std::max(worst_other_order, rel_error(lo, ls));
  }
  std::printf("[ attn+o   ] logits, worst normalized difference from the separate kernels: fused %.4f, "
              "folded norms + split attention %.4f\n",
              worst_vs_separate, worst_other_order);
  bool ran = false;
  for (const KernelStat& st : fused.kernel_stats()) ran |= st.name.ends_with("attention+o.fused");
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace kiln::gputest
