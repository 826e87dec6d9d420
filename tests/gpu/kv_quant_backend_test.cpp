// The whole model with a quantized KV cache (--kv-cache int8|fp8): CudaBackend against CpuBackend
// set to the same format (the CPU reference fake-quantizes each (token, KV head) vector after RoPE,
// the GPU stores the bytes and scales), on small random-weight configs (head dims 64, 80, 128; GQA
// 1, 3, 4, 7; half and interleaved RoPE; qkv bias), through forward (prefill in 3 chunks, so later
// chunks read dequantized cached positions; decode steps through the graph) and forward_batch
// (mixed prefill/decode steps over a paged pool -- their prefill chunks read a compact bf16 copy of
// their positions, kv_dequantize_rows, in one varlen launch -- then graph-replayed decode-only steps).
//
// Tolerance (normalized logit error): 5e-2 for int8, 1e-1 for fp8, against 3e-2 for the bf16
// backends (backend_test.cpp). Both sides quantize their own K/V, and the GPU's K/V differ from the
// CPU's by the bf16-activation noise (about 2^-9 of a value). Where that noise straddles a rounding
// edge of the 8-bit grid the two sides store neighbouring codes: a whole step apart (int8: amax / 127,
// about 2% of a typical value; fp8: 1/16 of the value), which happens for roughly noise / step of
// the values (int8 ~1 in 10, fp8 ~1 in 30). The K/V difference between the sides is thus 2-4x the
// bf16 one, and these random 2-3 layer models pass it on to the logits: first device run (before
// the tolerances were set) worst 2.0-3.0e-2 for int8 and 3.5-6.7e-2 for fp8 over these configs. The
// worst error is printed, next to how far the format moves the CPU's own logits from its fp32 cache
// (the size of the effect the GPU reproduces).
#include <algorithm>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "batch_test_util.h"
#include "fused_decode_test_util.h"
#include "gpu_test_models.h"
#include "gpu_test_util.h"
#include "kiln/error.h"
#include "model/random_weights.h"

namespace kiln::gputest {
namespace {

double tolerance(KvCacheFormat f) { return f == KvCacheFormat::int8 ? 5e-2 : 1e-1; }

ModelConfig config_of(int i) {
  ModelConfig c = small_llama();  // GQA 4, head_dim 64, half RoPE
  if (i == 1) {                   // GQA 3, head_dim 80, interleaved RoPE, qkv bias, tied
    c.name = "kvq-qwen-like";
    c.hidden_size = 240;
    c.n_heads = 3;
    c.head_dim = 80;
    c.rope.rot_dim = 80;
    c.rope.style = RopeStyle::interleaved;
    c.qkv_bias = true;
    c.tied_embeddings = true;
  } else if (i == 2) {  // GQA 7 (14/2)
    c.name = "kvq-gqa7";
    c.hidden_size = 896;
    c.intermediate_size = 1000;
    c.n_layers = 2;
    c.n_heads = 14;
    c.n_kv_heads = 2;
  } else if (i == 3) {  // no GQA, head_dim 128
    c.name = "kvq-mha-d128";
    c.hidden_size = 512;
    c.intermediate_size = 1376;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 4;
    c.head_dim = 128;
    c.rope.rot_dim = 128;
  }
  c.context_length = 1024;
  return c;
}

struct Param {
  int config;
  KvCacheFormat format;
};

class GpuKvQuantBackend : public testing::TestWithParam<Param> {};

TEST_P(GpuKvQuantBackend, ForwardMatchesCpuSameFormat) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config_of(GetParam().config);
  const KvCacheFormat f = GetParam().format;
  ModelWeights w = random_weights(c, 42, 0.08f);
  ThreadPool tp(2);
  CpuBackend cpu(c, w, tp);
  CudaBackend gpu(c, w, CudaBackendOptions{16, true});  // max_chunk 16: a 37-token prompt takes 3 chunks
  CudaBackend gpu_bf16(c, w, CudaBackendOptions{16, true});
  CpuBackend cpu_native(c, w, tp);
  const double tol = tolerance(f);
  cpu.set_kv_cache_format(f);
  gpu.set_kv_cache_format(f);
  auto cs = cpu.new_sequence(128);
  auto gs = gpu.new_sequence(128);
  auto bs = gpu_bf16.new_sequence(128);
  auto ns = cpu_native.new_sequence(128);
  auto p = prompt(37, c.vocab_size, 0);
  std::vector<float> lc, lg, lb, ln;
  cpu.forward(*cs, p, true, lc);
  gpu.forward(*gs, p, true, lg);
  gpu_bf16.forward(*bs, p, true, lb);
  cpu_native.forward(*ns, p, true, ln);
  double worst = rel_error(lg, lc), effect = rel_error(lc, ln);
  EXPECT_LT(worst, tol) << "prefill, all logits";
  EXPECT_NE(lg, lb) << "the quantized cache changes the logits (it is in use)";
  for (int step = 0; step < 6; ++step) {
    int32_t t = int32_t((step * 17 + 3) % c.vocab_size);
    cpu.forward(*cs, std::span<const int32_t>(&t, 1), false, lc);
    gpu.forward(*gs, std::span<const int32_t>(&t, 1), false, lg);
    cpu_native.forward(*ns, std::span<const int32_t>(&t, 1), false, ln);
    const double err = rel_error(lg, lc);
    worst = std::max(worst, err);
    effect = std::max(effect, rel_error(lc, ln));
    EXPECT_LT(err, tol) << "decode step " << step;
  }
  std::printf("[   info   ] %s %s: worst GPU-vs-CPU logit error %.2e (tolerance %.0e); the format moves the CPU's "
              "logits by up to %.2e\n",
              c.name.c_str(), std::string(kv_cache_format_name(f)).c_str(), worst, tol, effect);
}

// A pool on both backends: blocks of 16, sequence s owning blocks s, s + 3, s + 6, ... (interleaved).
TEST_P(GpuKvQuantBackend, ForwardBatchMatchesCpuSameFormat) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config_of(GetParam().config);
  const KvCacheFormat f = GetParam().format;
  const int64_t V = c.vocab_size;
  ModelWeights w = random_weights(c, 43, 0.08f);
  ThreadPool tp(2);
  CpuBackend cpu(c, w, tp);
  CudaBackend gpu(c, w);
  cpu.set_kv_cache_format(f);
  gpu.set_kv_cache_format(f);
  const int32_t NB = 48, BS = 16;
  auto cpu_pool = cpu.new_kv_pool(NB, BS);
  auto gpu_pool = gpu.new_kv_pool(NB, BS);
  std::vector<std::vector<int32_t>> table(3);
  for (int32_t s = 0; s < 3; ++s)
    for (int32_t i = 0; i < NB / 3; ++i) table[size_t(s)].push_back(s + 3 * i);
  std::vector<int64_t> len(3, 0);
  std::vector<std::vector<int32_t>> toks(3);
  for (size_t s = 0; s < 3; ++s) toks[s] = prompt(200, V, int64_t(s));
  double worst = 0;
  // Runs (sequence, number of new tokens) as one step; every entry wants logits.
  auto run = [&](std::vector<std::pair<size_t, int64_t>> parts, const char* what) {
    SCOPED_TRACE(what);
    std::vector<BatchEntry> e;
    for (auto [s, n] : parts) {
      BatchEntry b;
      b.tokens = std::span<const int32_t>(toks[s]).subspan(size_t(len[s]), size_t(n));
      b.first_position = len[s];
      b.block_table = table[s];
      b.want_logits = true;
      e.push_back(b);
    }
    std::vector<float> lc, lg;
    cpu.forward_batch(*cpu_pool, e, lc);
    gpu.forward_batch(*gpu_pool, e, lg);
    ASSERT_EQ(lg.size(), lc.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      auto row = [&](const std::vector<float>& l) { return std::span<const float>(l).subspan(i * size_t(V), size_t(V)); };
      const double err = rel_error(row(lg), row(lc));
      worst = std::max(worst, err);
      EXPECT_LT(err, tolerance(f)) << "entry " << i;
    }
    for (auto [s, n] : parts) len[s] += n;
  };
  run({{0, 37}, {1, 20}, {2, 1}}, "prefills from 0");
  run({{0, 1}, {1, 45}, {2, 1}}, "mixed: decodes around a prefill chunk at 20");
  for (int k = 0; k < 4; ++k) run({{2, 1}, {0, 1}, {1, 1}}, "decode only (eager, eager, capture, replay)");
  run({{2, 70}, {0, 1}}, "a prefill chunk at 5 next to a decode");
  std::printf("[   info   ] %s %s forward_batch: worst GPU-vs-CPU logit error %.2e\n", c.name.c_str(),
              std::string(kv_cache_format_name(f)).c_str(), worst);
}

// The fused qkv GEMV into an 8-bit cache (session 37: each KV head's last block encodes the
// vector, gemv_epilogues.cuh's RopeKvQuantEpi) against the plain qkv GEMV and the quantizing
// rope_qkv launch: the same bytes and scales, so the same logits bit for bit, through a single
// sequence's decode steps and a one-entry pool's (enqueue_decode with B = 1), graphs replayed.
TEST_P(GpuKvQuantBackend, FusedDecodeMatchesUnfusedBitForBit) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config_of(GetParam().config);
  const KvCacheFormat f = GetParam().format;
  ModelWeights w = random_weights(c, 44, 0.08f);
  CudaBackendOptions fused_on, fused_off;
  fused_on.norm_fold = false;  // the folded norm rounds differently (backend_test.cpp)
  fused_off.fused_decode = false;
  CudaBackend a(c, w, fused_on), b(c, w, fused_off);
  a.set_kv_cache_format(f);
  b.set_kv_cache_format(f);
  auto sa = a.new_sequence(128), sb = b.new_sequence(128);
  bool rope_fused = false;  // the fused kernel did run
  ASSERT_NO_FATAL_FAILURE(
      decode_both_same_bits(a, b, *sa, *sb, prompt(37, c.vocab_size, 1), 8, 29, 5, c.vocab_size, rope_fused))
      << "single sequence";
  EXPECT_TRUE(rope_fused);
  a.set_profiling(false);
  std::vector<float> la, lb;
  auto pa = a.new_kv_pool(12, 16), pb = b.new_kv_pool(12, 16);
  const std::vector<int32_t> table = {7, 2, 9, 4, 11, 0};  // scattered blocks
  const std::vector<int32_t> toks = prompt(60, c.vocab_size, 2);
  for (int64_t len = 0, step = 0; len < 60; ++step) {
    const int64_t n = step == 0 ? 50 : 1;
    BatchEntry e;
    e.tokens = std::span<const int32_t>(toks).subspan(size_t(len), size_t(n));
    e.first_position = len;
    e.block_table = table;
    e.want_logits = true;
    std::vector<BatchEntry> es{e};
    a.forward_batch(*pa, es, la);
    b.forward_batch(*pb, es, lb);
    ASSERT_EQ(la, lb) << "pool step " << step;
    len += n;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, GpuKvQuantBackend,
                         testing::Values(Param{0, KvCacheFormat::int8}, Param{1, KvCacheFormat::int8},
                                         Param{2, KvCacheFormat::int8}, Param{3, KvCacheFormat::int8},
                                         Param{0, KvCacheFormat::fp8}, Param{2, KvCacheFormat::fp8},
                                         Param{3, KvCacheFormat::fp8}));

TEST(GpuKvQuantPool, BytesPerTokenHalveAndOddHeadDimsAreRefused) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config_of(3);
  auto gpu = CudaBackend::random(c, 1, 0.08f);
  const int64_t bf16_bytes = gpu->kv_bytes_per_token();
  EXPECT_EQ(bf16_bytes, 2 * c.n_layers * c.kv_dim() * 2);
  gpu->set_kv_cache_format(KvCacheFormat::int8);
  EXPECT_EQ(gpu->kv_bytes_per_token(), 2 * c.n_layers * c.kv_dim() + 2 * c.n_layers * c.n_kv_heads * 4);
  EXPECT_GE(gpu->kv_blocks_for_budget(int64_t(1) << 30, 16), 2 * (int64_t(1) << 30) / (16 * bf16_bytes) * 96 / 100);
  gpu->set_kv_cache_format(KvCacheFormat::fp8);
  EXPECT_EQ(gpu->kv_bytes_per_element(), 1);

  ModelConfig odd = small_llama();  // head_dim 72: rows of 72 bytes are not 16-byte aligned
  odd.head_dim = 72;
  odd.rope.rot_dim = 72;
  auto g72 = CudaBackend::random(odd, 1, 0.08f);
  try {
    g72->set_kv_cache_format(KvCacheFormat::int8);
    ADD_FAILURE() << "head_dim 72 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
  }
}

}  // namespace
}  // namespace kiln::gputest
