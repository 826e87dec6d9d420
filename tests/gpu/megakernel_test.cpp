// The decode megakernel (kernels/cuda/megakernel/decode_megakernel.h) end to end: a CudaBackend
// whose single-sequence decode steps run as one persistent kernel, against the CPU reference
// (the oracle) and against the same GPU backend with the megakernel off (the fused decode kernels),
// for bf16, int8 per channel and int4 g128 weights, on shapes that exercise its paths: GQA groups
// of 1, 2 and 4, partial rotation, interleaved RoPE with a qkv bias, rows of one chunk, of several
// and of a partial last chunk, caches of one attention split per KV head and of many (the last
// block's merge), CUDA-graph replay and the direct (profiled) launch.
//
// The megakernel rounds as the folded fused step does (gemv_fused.h's NormProduce / NormApply),
// sums its warps' K ranges in another order and attends in fp32 with its own split, so it is held
// to the GPU backend's tolerance against the CPU (kTolLogits) and to a tighter one against the
// fused kernels.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"
#include "model/random_weights.h"
#include "quant_test_util.h"

namespace kiln::gputest {
namespace {

constexpr double kTolLogits = 3e-2;     // GPU (bf16 activations) against the fp32 CPU reference
constexpr double kTolKernels = 2e-2;  // megakernel against the fused kernels, both bf16 between ops

struct Shape {
  const char* name;
  int64_t hidden, inter;
  int64_t n_heads, n_kv_heads;
  int rot_dim;
  bool interleaved_with_bias;
};

ModelConfig config_of(const Shape& s) {
  ModelConfig c;
  c.architecture = "llama";
  c.name = s.name;
  c.vocab_size = 777;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.inter;
  c.n_layers = 3;
  c.n_heads = s.n_heads;
  c.n_kv_heads = s.n_kv_heads;
  c.head_dim = 128;
  c.context_length = 4096;
  c.rope.theta = 10000.0f;
  c.rope.rot_dim = s.rot_dim;
  c.rope.style = s.interleaved_with_bias ? RopeStyle::interleaved : RopeStyle::half;
  c.qkv_bias = s.interleaved_with_bias;
  return c;
}

// random_weights' bf16 model with every projection replaced by random codes of `f` (int8 per
// channel, int4 groups of 128), the host data their dequantized values. The amplitude shrinks with
// the width (0.06 at hidden 512) so activations keep their scale: at a fixed 0.06 the hidden-2048
// int4 model's logits already differed by 9.5% between the fused kernels and the CPU.
ModelWeights weights_of(const ModelConfig& c, QuantFormat f) {
  const float amplitude = 0.06f * std::sqrt(512.0f / float(c.hidden_size));
  ModelWeights w = random_weights(c, 91, amplitude);
  if (f == QuantFormat::none) return w;
  uint32_t seed = 500;
  for (LayerWeights& L : w.layers)
    for (HostMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      *m = random_quantized(f, m->rows, m->cols, f == QuantFormat::int8 ? m->cols : 128, seed++, amplitude);
  return w;
}

std::vector<int32_t> tokens(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 131 + 7 * salt + 3) % vocab);
  return t;
}

struct Case {
  QuantFormat format;
  Shape shape;
  int64_t prompt;  // cached positions before the decode steps
  int steps;
};

class GpuMegakernel : public testing::TestWithParam<Case> {};

TEST_P(GpuMegakernel, DecodeMatchesCpuAndFusedKernels) {
  KILN_REQUIRE_GPU();
  const Case k = GetParam();
  const ModelConfig c = config_of(k.shape);
  const ModelWeights w = weights_of(c, k.format);
  ThreadPool pool(2);
  CpuBackend cpu(c, w, pool);
  CudaBackendOptions on, off;
  on.megakernel = true;
  off.megakernel = false;
  CudaBackend mk(c, w, on), fused(c, w, off);
  ASSERT_TRUE(mk.uses_megakernel()) << mk.megakernel_note();
  ASSERT_FALSE(fused.uses_megakernel());
  const int64_t capacity = k.prompt + k.steps + 8;
  auto sc = cpu.new_sequence(capacity), sm = mk.new_sequence(capacity), sf = fused.new_sequence(capacity);
  const auto p = tokens(k.prompt, c.vocab_size, 1);
  std::vector<float> lc, lm, lf;
  cpu.forward(*sc, p, false, lc);
  mk.forward(*sm, p, false, lm);
  fused.forward(*sf, p, false, lf);
  ASSERT_EQ(lm, lf) << "prefill (the same kernels in both)";
  double worst_cpu = 0, worst_fused = 0, worst_fused_cpu = 0;
  int argmax_same = 0;
  for (int step = 0; step < k.steps; ++step) {
    const int32_t t = int32_t((step * 29 + 5) % c.vocab_size);
    if (step == k.steps - 1) mk.set_profiling(true);  // the last step launched directly, not replayed
    cpu.forward(*sc, std::span<const int32_t>(&t, 1), false, lc);
    mk.forward(*sm, std::span<const int32_t>(&t, 1), false, lm);
    fused.forward(*sf, std::span<const int32_t>(&t, 1), false, lf);
    const double ec = rel_error(lm, lc), ef = rel_error(lm, lf);
    worst_cpu = std::max(worst_cpu, ec);
    worst_fused = std::max(worst_fused, ef);
    worst_fused_cpu = std::max(worst_fused_cpu, rel_error(lf, lc));
    EXPECT_LT(ec, kTolLogits) << "against the CPU, decode step " << step;
    EXPECT_LT(ef, kTolKernels) << "against the fused kernels, decode step " << step;
    argmax_same += std::max_element(lm.begin(), lm.end()) - lm.begin() == std::max_element(lc.begin(), lc.end()) - lc.begin();
  }
  std::printf(
      "[ mk       ] %s: worst rel. error %.4f vs CPU, %.4f vs fused kernels (fused vs CPU %.4f); argmax = CPU's on %d "
      "of %d steps\n",
      k.shape.name, worst_cpu, worst_fused, worst_fused_cpu, argmax_same, k.steps);
  bool ran = false;
  for (const KernelStat& st : mk.kernel_stats()) ran |= st.name == "decode.megakernel";
  EXPECT_TRUE(ran) << "the profiled step did not run the megakernel";
}

std::string case_name(const testing::TestParamInfo<Case>& i) {
  const char* f = i.param.format == QuantFormat::int4 ? "int4" : i.param.format == QuantFormat::int8 ? "int8" : "bf16";
  return std::string(f) + "_" + i.param.shape.name;
}

// gqa2: hidden 512 (int4 rows of half a chunk), inter 1024; gqa4: 8 / 2 heads, hidden 1024; mha: 4 /
// 4 heads, partial rotation (64 of 128); qwen: interleaved RoPE with a bias; wide: hidden 2048,
// inter 2816 (down's rows 2.75 chunks in int4). Prompts of 70 (one split a head until 128
// positions, then two and three) and 1100 (18 splits a head, each merged by the head's last block).
const Shape kGqa2{"gqa2", 512, 1024, 4, 2, 128, false};
const Shape kGqa4{"gqa4", 1024, 1024, 8, 2, 128, false};
const Shape kMha{"mha_partial_rope", 512, 768, 4, 4, 64, false};
const Shape kQwen{"interleaved_bias", 512, 1024, 4, 2, 128, true};
const Shape kWide{"wide", 2048, 2816, 16, 4, 128, false};
const Shape kLongFfn{"long_ffn", 512, 4096, 4, 2, 128, false};  // several gate/up tiles a block, down rows of 4 chunks

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuMegakernel,
    testing::Values(Case{QuantFormat::none, kGqa2, 70, 70}, Case{QuantFormat::int8, kGqa2, 70, 70},
                    Case{QuantFormat::int4, kGqa2, 70, 70}, Case{QuantFormat::none, kGqa4, 1100, 12},
                    Case{QuantFormat::int4, kGqa4, 1100, 12}, Case{QuantFormat::int8, kMha, 40, 30},
                    Case{QuantFormat::int4, kQwen, 40, 30}, Case{QuantFormat::none, kWide, 200, 10},
                    Case{QuantFormat::int8, kWide, 200, 10}, Case{QuantFormat::int4, kWide, 200, 10},
                    Case{QuantFormat::int4, kLongFfn, 40, 10}, Case{QuantFormat::none, kLongFfn, 40, 10}),
    case_name);

// Where the megakernel does not apply, the backend says why and runs the fused kernels: head_dim 64,
// a quantized KV cache; and it is off unless asked for.
TEST(GpuMegakernelScope, FallsBackWithAReason) {
  KILN_REQUIRE_GPU();
  CudaBackendOptions on;
  on.megakernel = true;
  ModelConfig c = config_of(kGqa2);
  c.head_dim = 64;
  c.rope.rot_dim = 64;
  CudaBackend b(c, random_weights(c, 3, 0.06f), on);
  EXPECT_FALSE(b.uses_megakernel());
  EXPECT_NE(b.megakernel_note().find("head_dim"), std::string::npos) << b.megakernel_note();
  auto s = b.new_sequence(64);
  std::vector<float> logits;
  int32_t t = 5;
  b.forward(*s, std::span<const int32_t>(&t, 1), false, logits);
  b.forward(*s, std::span<const int32_t>(&t, 1), false, logits);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));

  const ModelConfig c2 = config_of(kGqa2);
  CudaBackend q(c2, random_weights(c2, 3, 0.06f), on);
  ASSERT_TRUE(q.uses_megakernel()) << q.megakernel_note();
  q.set_kv_cache_format(KvCacheFormat::int8);
  auto sq = q.new_sequence(64);  // an int8 cache: the fused kernels, the megakernel reads bf16 only
  q.set_profiling(true);
  q.forward(*sq, std::span<const int32_t>(&t, 1), false, logits);
  q.forward(*sq, std::span<const int32_t>(&t, 1), false, logits);
  for (const KernelStat& st : q.kernel_stats()) EXPECT_NE(st.name, "decode.megakernel");

  CudaBackend d(c2, random_weights(c2, 3, 0.06f));  // default options
  if (std::getenv("KILN_MEGAKERNEL") == nullptr) {
    EXPECT_FALSE(d.uses_megakernel());
  }
}

}  // namespace
}  // namespace kiln::gputest
