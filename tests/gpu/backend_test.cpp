// The whole model: CudaBackend against CpuBackend on small random-weight configs (weights rounded
// to bf16 on the host, so both compute with the same values). The GPU keeps bf16 activations
// between kernels, the CPU fp32: logits agree to ~1e-2 in normalized error (kTolLogits), and greedy
// continuations agree wherever the CPU's top-2 logit gap is clearly above that noise.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "gpu_test_models.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "model/random_weights.h"

namespace kiln::gputest {
namespace {

constexpr double kTolLogits = 3e-2;

ModelConfig small_qwen_like() {  // qkv bias, head_dim 80, GQA 3, interleaved RoPE with llama3 scaling, tied
  ModelConfig c = small_llama();
  c.name = "test-qwen";
  c.hidden_size = 240;
  c.n_heads = 3;
  c.n_kv_heads = 1;
  c.head_dim = 80;
  c.rope.rot_dim = 80;
  c.rope.style = RopeStyle::interleaved;
  c.rope.llama3_factor = 8.0f;
  c.rope.llama3_original_context = 64;
  c.qkv_bias = true;
  c.tied_embeddings = true;
  c.rms_eps = 1e-6f;
  return c;
}

ModelConfig small_gqa7() {  // GQA 7 (14/2 heads), head_dim 64, a vocabulary that is no multiple of 64
  ModelConfig c = small_llama();
  c.name = "test-gqa7";
  c.vocab_size = 1001;
  c.hidden_size = 896;
  c.intermediate_size = 1000;
  c.n_layers = 2;
  c.n_heads = 14;
  c.n_kv_heads = 2;
  return c;
}

ModelConfig small_mha_d128() {  // no GQA (4/4 heads), head_dim 128, interleaved RoPE, separate lm_head
  ModelConfig c = small_llama();
  c.name = "test-mha-d128";
  c.vocab_size = 777;
  c.hidden_size = 512;
  c.intermediate_size = 1376;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.head_dim = 128;
  c.rope.rot_dim = 128;
  c.rope.style = RopeStyle::interleaved;
  return c;
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 131 + 7) % vocab);
  return t;
}

int32_t argmax(std::span<const float> v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }
float top2_gap(std::span<const float> v) {
  std::vector<float> s(v.begin(), v.end());
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<>());
  return s[0] - s[1];
}

class GpuBackend : public testing::TestWithParam<int> {
 protected:
  ModelConfig config() const {
    switch (GetParam()) {
      case 0: return small_llama();
      case 1: return small_qwen_like();
      case 2: return small_gqa7();
      default: return small_mha_d128();
    }
  }
};

// Capacity 128 and 300: the decode steps of the second run the RMSNorms folded into the GEMVs
// (more than 256 positions, NormFoldRule::folds).
TEST_P(GpuBackend, PrefillAndDecodeLogitsMatchCpu) {
  KILN_REQUIRE_GPU();
  for (int64_t capacity : {128, 300}) {
    SCOPED_TRACE(testing::Message() << "capacity " << capacity);
    ModelConfig c = config();
    ModelWeights w = random_weights(c, 42, 0.08f);
    ThreadPool pool(2);
    CpuBackend cpu(c, w, pool);
    CudaBackend gpu(c, w, CudaBackendOptions{16, true});  // max_chunk 16: a 37-token prompt takes 3 chunks
    auto cs = cpu.new_sequence(capacity);
    auto gs = gpu.new_sequence(capacity);
    auto p = prompt(37, c.vocab_size);
    std::vector<float> lc, lg;
    cpu.forward(*cs, p, true, lc);
    gpu.forward(*gs, p, true, lg);
    EXPECT_LT(rel_error(lg, lc), kTolLogits) << "prefill, all logits";
    for (int step = 0; step < 5; ++step) {
      int32_t t = int32_t((step * 17 + 3) % c.vocab_size);
      cpu.forward(*cs, std::span<const int32_t>(&t, 1), false, lc);
      gpu.forward(*gs, std::span<const int32_t>(&t, 1), false, lg);
      EXPECT_LT(rel_error(lg, lc), kTolLogits) << "decode step " << step;
    }
  }
}

TEST_P(GpuBackend, Greedy64TokensMatchCpuWhereGapsAllow) {
  KILN_REQUIRE_GPU();
  ModelConfig c = config();
  ModelWeights w = random_weights(c, 7, 0.08f);
  ThreadPool pool(2);
  CpuBackend cpu(c, w, pool);
  CudaBackend gpu(c, w);
  auto cs = cpu.new_sequence(256);
  auto gs = gpu.new_sequence(256);
  std::vector<float> lc, lg;
  auto p = prompt(20, c.vocab_size);
  cpu.forward(*cs, p, false, lc);
  gpu.forward(*gs, p, false, lg);
  for (int step = 0; step < 64; ++step) {
    int32_t tc = argmax(lc), tg = argmax(lg);
    if (tc != tg) {
      // Allowed only when the CPU itself barely prefers its token; after that the paths diverge.
      float gap = top2_gap(lc), scale = *std::max_element(lc.begin(), lc.end()) - *std::min_element(lc.begin(), lc.end());
      EXPECT_LT(gap, 0.02f * scale) << "step " << step << ": cpu " << tc << " gpu " << tg << " (gap " << gap << ")";
      return;
    }
    cpu.forward(*cs, std::span<const int32_t>(&tc, 1), false, lc);
    gpu.forward(*gs, std::span<const int32_t>(&tg, 1), false, lg);
  }
}

TEST_P(GpuBackend, GraphAndNoGraphDecodeAreIdentical) {
  KILN_REQUIRE_GPU();
  ModelConfig c = config();
  ModelWeights w = random_weights(c, 9, 0.08f);
  CudaBackend a(c, w), b(c, w);
  b.set_use_graphs(false);
  auto sa = a.new_sequence(600), sb = b.new_sequence(600);
  auto p = prompt(300, c.vocab_size);  // long enough that decode spans two attention splits
  std::vector<float> la, lb;
  a.forward(*sa, p, false, la);
  b.forward(*sb, p, false, lb);
  ASSERT_EQ(la, lb);
  for (int step = 0; step < 16; ++step) {
    int32_t t = argmax(la);
    a.forward(*sa, std::span<const int32_t>(&t, 1), false, la);
    b.forward(*sb, std::span<const int32_t>(&t, 1), false, lb);
    ASSERT_EQ(la, lb) << "step " << step;
  }
}

// forward_last (the decode loops' call) hands over the decode graph's pinned logits in place of a
// copy: the same bits as forward's, step after step, and the same where it falls back to forward
// (no graphs: every step launched eagerly).
TEST_P(GpuBackend, ForwardLastGivesForwardsLogits) {
  KILN_REQUIRE_GPU();
  ModelConfig c = config();
  ModelWeights w = random_weights(c, 13, 0.08f);
  for (bool graphs : {true, false}) {
    CudaBackend a(c, w), b(c, w);
    a.set_use_graphs(graphs);
    b.set_use_graphs(graphs);
    auto sa = a.new_sequence(64), sb = b.new_sequence(64);
    auto p = prompt(20, c.vocab_size);
    std::vector<float> expected;
    b.forward(*sb, p, false, expected);
    std::span<float> got = a.forward_last(*sa, p);
    ASSERT_EQ(std::vector<float>(got.begin(), got.end()), expected) << "graphs " << graphs;
    for (int step = 0; step < 8; ++step) {
      int32_t t = argmax(expected);
      b.forward(*sb, std::span<const int32_t>(&t, 1), false, expected);
      got = a.forward_last(*sa, std::span<const int32_t>(&t, 1));
      ASSERT_EQ(got.size(), size_t(c.vocab_size));
      ASSERT_EQ(std::vector<float>(got.begin(), got.end()), expected) << "graphs " << graphs << ", step " << step;
    }
    EXPECT_EQ(sa->n_past(), sb->n_past());
  }
}

// The fused decode GEMVs (RoPE + K/V write and SwiGLU folded in; gemv_fused.h) share the
// unfused kernels' arithmetic and reduction order: the logits must be the same bits, for every
// config and with a partial rotation (rot_dim < head_dim: the unrotated tail passes through).
TEST_P(GpuBackend, FusedDecodeMatchesUnfusedBitForBit) {
  KILN_REQUIRE_GPU();
  for (bool partial : {false, true}) {
    ModelConfig c = config();
    if (partial) c.rope.rot_dim = int(c.head_dim) / 2 / 16 * 16;
    if (c.rope.rot_dim == 0) continue;
    ModelWeights w = random_weights(c, 11, 0.08f);
    CudaBackendOptions fused_on, fused_off;
    fused_on.norm_fold = false;  // the folded norm rounds differently: FoldedNormDecodeCloseToNormKernel
    fused_on.megakernel = false;  // so does the megakernel (megakernel_test.cpp)
    fused_off.fused_decode = false;
    fused_off.megakernel = false;
    CudaBackend a(c, w, fused_on), b(c, w, fused_off);
    auto sa = a.new_sequence(300), sb = b.new_sequence(300);
    auto p = prompt(70, c.vocab_size);  // past one 64-position attention tile
    std::vector<float> la, lb;
    a.forward(*sa, p, false, la);
    b.forward(*sb, p, false, lb);
    ASSERT_EQ(la, lb) << "prefill (never fused)";
    for (int step = 0; step < 12; ++step) {
      int32_t t = int32_t((step * 29 + 5) % c.vocab_size);
      a.forward(*sa, std::span<const int32_t>(&t, 1), false, la);
      b.forward(*sb, std::span<const int32_t>(&t, 1), false, lb);
      ASSERT_EQ(la, lb) << "decode step " << step << (partial ? " (partial rotation)" : "");
    }
  }
}

// The RMSNorms folded into the fused decode GEMVs (gemv_fused.h: z = bf16(x o w) rounded before
// the scale, not after): not the norm kernel's bits, so the decode logits are compared to the
// unfolded fused path within the GPU-vs-CPU tolerance (kTolLogits), and the folded kernels must
// have run (a capacity of 300: the fold needs more than 256 positions, NormFoldRule::folds). Prefill
// never folds: the same bits.
TEST_P(GpuBackend, FoldedNormDecodeCloseToNormKernel) {
  KILN_REQUIRE_GPU();
  ModelConfig c = config();
  ModelWeights w = random_weights(c, 12, 0.08f);
  CudaBackendOptions fold_on, fold_off;
  fold_on.megakernel = false;  // the fused kernels (the megakernel folds its norms too: megakernel_test.cpp)
  fold_off.norm_fold = false;
  fold_off.megakernel = false;
  CudaBackend a(c, w, fold_on), b(c, w, fold_off);
  auto sa = a.new_sequence(300), sb = b.new_sequence(300);
  auto p = prompt(70, c.vocab_size);
  std::vector<float> la, lb;
  a.forward(*sa, p, false, la);
  b.forward(*sb, p, false, lb);
  ASSERT_EQ(la, lb) << "prefill (never folded)";
  double worst = 0;
  for (int step = 0; step < 12; ++step) {
    int32_t t = int32_t((step * 29 + 5) % c.vocab_size);
    if (step == 11) a.set_profiling(true);  // graphs are bypassed while profiling
    a.forward(*sa, std::span<const int32_t>(&t, 1), false, la);
    b.forward(*sb, std::span<const int32_t>(&t, 1), false, lb);
    const double e = rel_error(la, lb);
    worst = std::max(worst, e);
    EXPECT_LT(e, kTolLogits) << "decode step " << step;
  }
  std::printf("[   info   ] folded vs unfolded norm, worst decode logit error %.2e\n", worst);
  bool o_folded = false, down_folded = false;
  for (const KernelStat& st : a.kernel_stats()) {
    o_folded |= st.name.ends_with("o+norm.gemv");
    down_folded |= st.name.ends_with("down+norm.gemv");
  }
  EXPECT_TRUE(o_folded);
  EXPECT_EQ(down_folded, c.n_layers > 1);
}

TEST_P(GpuBackend, RandomFactoryMatchesHostRandomWeights) {
  KILN_REQUIRE_GPU();
  ModelConfig c = config();
  auto g1 = CudaBackend::random(c, 123, 0.05f);
  CudaBackend g2(c, random_weights(c, 123, 0.05f));
  auto s1 = g1->new_sequence(64), s2 = g2.new_sequence(64);
  auto p = prompt(19, c.vocab_size);
  std::vector<float> l1, l2;
  g1->forward(*s1, p, true, l1);
  g2.forward(*s2, p, true, l2);
  EXPECT_EQ(l1, l2) << "GPU-generated weights differ from the host generator's";
}

TEST_P(GpuBackend, ProfilingReportsEveryKernel) {
  KILN_REQUIRE_GPU();
  ModelConfig c = config();
  auto g = CudaBackend::random(c, 1, 0.05f);
  g->set_profiling(true);
  auto s = g->new_sequence(64);
  std::vector<float> l;
  g->forward(*s, prompt(30, c.vocab_size), false, l);
  int32_t t = 1;
  g->forward(*s, std::span<const int32_t>(&t, 1), false, l);
  auto stats = g->kernel_stats();
  ASSERT_FALSE(stats.empty());
  bool saw_decode = false;
  for (const KernelStat& st : stats) {
    EXPECT_GT(st.calls, 0) << st.name;
    EXPECT_GE(st.total_ms, 0) << st.name;
    saw_decode |= st.name == "attention.decode";
  }
  EXPECT_TRUE(saw_decode);
}

std::string config_name(const testing::TestParamInfo<int>& info) {
  static const char* const names[] = {"llama_gqa4", "qwen_bias_d80_gqa3", "gqa7_d64_vocab1001", "mha_d128"};
  return names[info.param];
}
INSTANTIATE_TEST_SUITE_P(Configs, GpuBackend, testing::Values(0, 1, 2, 3), config_name);

// The prefill path's fused gate/up GEMM (gate_up+silu.gemm: SwiGLU in the epilogue) inside the
// model: an intermediate size that is a multiple of 128 and large enough (8704, 2I / 256 = 68 tiles
// a row block) that a 300-token prompt (3 row blocks) takes the 128x256 tiles the fused kernel
// runs on. Logits against the CPU, and the profile shows the fused op ran (on an sm_90a device).
TEST(GpuBackendFused, PrefillWithFusedGateUpGemmMatchesCpu) {
  KILN_REQUIRE_GPU();
  ModelConfig c = small_llama();
  c.name = "test-llama-i8704";
  c.intermediate_size = 8704;
  c.n_layers = 2;
  ModelWeights w = random_weights(c, 5, 0.08f);
  ThreadPool pool(4);
  CpuBackend cpu(c, w, pool);
  CudaBackend gpu(c, w);
  gpu.set_profiling(true);
  auto cs = cpu.new_sequence(512);
  auto gs = gpu.new_sequence(512);
  auto p = prompt(300, c.vocab_size);
  std::vector<float> lc, lg;
  cpu.forward(*cs, p, false, lc);
  gpu.forward(*gs, p, false, lg);
  EXPECT_LT(rel_error(lg, lc), kTolLogits);
  bool fused = false;
  for (const KernelStat& st : gpu.kernel_stats()) fused |= st.name == "gate_up+silu.gemm";
  if (cuda::gemm_wgmma_available())
    EXPECT_TRUE(fused) << "the 300-row prefill should take the fused gate/up GEMM on this device";
  else
    std::printf("[   INFO   ] no sm_90a device: the unfused gate/up GEMM ran\n");
}

TEST(GpuPresets, ShapesAreValid) {  // runs without a GPU too
  for (const std::string& name : preset_names()) {
    ModelConfig c = preset_config(name);
    EXPECT_NO_THROW(c.validate()) << name;
  }
  EXPECT_EQ(preset_config("llama3-8b").vocab_size, 128256);
  EXPECT_NEAR(double(preset_config("llama3-8b").n_params()), 8.03e9, 0.01e9);
}

}  // namespace
}  // namespace kiln::gputest
