// CudaBackend::forward_batch (continuous batching over the paged KV pool):
//   * against CpuBackend::forward_batch on mixed steps (decodes at different lengths, prefill
//     chunks from 0 and from mid-sequence, want_logits on and off), same bf16-rounded weights,
//     shuffled block tables: logits within kTolLogits (the bf16 tolerance of backend_test.cpp);
//   * N sequences batched == each run alone through forward() (argmax equal wherever the top-2
//     gap is clear of bf16 noise, logits within kTolLogits);
//   * decode steps replayed from CUDA graphs == the same steps run eagerly: bit-identical logits
//     (both run the same padded (batch bucket, table width) shapes; the graph only replays them);
//   * bad input throws kiln::Error and leaves the backend usable.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "batch_test_util.h"
#include "gpu_test_util.h"
#include "gpu_test_models.h"
#include "kiln/error.h"
#include "model/random_weights.h"

namespace kiln::gputest {
namespace {

constexpr double kTolLogits = 3e-2;  // as backend_test.cpp: bf16 activations vs the fp32 CPU

class GpuBatch : public testing::TestWithParam<int> {
 protected:
  ModelConfig config() const { return GetParam() == 0 ? batch_llama() : batch_d128_bias(); }
};

TEST_P(GpuBatch, MixedStepsMatchCpu) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config();
  const int64_t V = c.vocab_size;
  ModelWeights w = random_weights(c, 42, 0.08f);
  ThreadPool tp(2);
  CpuBackend cpu(c, w, tp);
  CudaBackend gpu(c, w);
  const int32_t NB = 96, BS = 16;
  auto cpu_pool = cpu.new_kv_pool(NB, BS);
  auto gpu_pool = gpu.new_kv_pool(NB, BS);
  Blocks blocks(NB, BS, 6, 3);
  std::vector<int64_t> len(6, 0);  // tokens cached per sequence
  auto tok = [&](size_t s, int64_t k) { return int32_t((k * 17 + int64_t(s) * 5 + 3) % V); };
  double worst = 0;  // largest normalized logit error over all rows (printed: the margin)

  auto run = [&](const std::vector<Step>& steps, const char* what) {
    SCOPED_TRACE(what);
    std::vector<BatchEntry> e = entries_of(steps, blocks);
    std::vector<float> lc, lg;
    cpu.forward_batch(*cpu_pool, e, lc);
    gpu.forward_batch(*gpu_pool, e, lg);
    size_t wanted = 0;
    for (const Step& st : steps) wanted += st.want;
    ASSERT_EQ(lc.size(), wanted * size_t(V));
    ASSERT_EQ(lg.size(), lc.size());
    for (size_t i = 0; i < wanted; ++i) {
      const double err = rel_error(row(lg, i, V), row(lc, i, V));
      worst = std::max(worst, err);
      EXPECT_LT(err, kTolLogits) << "row " << i;
    }
    for (const Step& st : steps) len[st.s] = st.first + int64_t(st.tokens.size());
  };
  auto p = [&](size_t s, int64_t n) { return prompt(n, V, int64_t(s)); };

  // Step 1: prefills from 0 (37 tokens; the first 20 of 45, no logits; exactly one block), and a
  // one-token sequence (a decode at position 0).
  run({{0, p(0, 37), 0, true}, {1, p(1, 20), 0, false}, {2, {tok(2, 0)}, 0, true}, {3, p(3, 16), 0, true}},
      "step 1: prefills from 0");
  // Step 2: decodes at 37, 1 and 16 around a mid-sequence prefill chunk (25 tokens at 20) and a new
  // 70-token prompt; one decode without logits.
  const std::vector<int32_t> full1 = p(1, 45);
  run({{0, {tok(0, 1)}, len[0], true},
       {1, std::vector<int32_t>(full1.begin() + 20, full1.end()), len[1], true},
       {2, {tok(2, 1)}, len[2], false},
       {4, p(4, 70), 0, true},
       {3, {tok(3, 1)}, len[3], true}},
      "step 2: mixed");
  // Steps 3-6: decode only (the padded, graph-captured path: eager, eager, capture, replay).
  for (int k = 0; k < 4; ++k) {
    std::vector<Step> steps;
    for (size_t s : {size_t(3), size_t(0), size_t(4), size_t(2), size_t(1)}) steps.push_back({s, {tok(s, 2 + k)}, len[s], true});
    run(steps, "decode-only step");
  }
  // Step 7: a long prompt chunk from mid-sequence (crossing several blocks) next to decodes.
  run({{5, p(5, 33), 0, false}, {0, {tok(0, 9)}, len[0], true}}, "step 7");
  {
    auto full = p(5, 33 + 90);
    run({{5, std::vector<int32_t>(full.begin() + 33, full.end()), 33, true}, {1, {tok(1, 9)}, len[1], true}},
        "step 8: prefill chunk at 33");
  }
  std::printf("[   info   ] worst GPU-vs-CPU logit error %.2e (tolerance %.0e)\n", worst, kTolLogits);
}

// Each sequence batched with the others == that sequence alone through forward() on the same GPU
// backend. The alone run's argmax feeds both (teacher forcing), so one near-tie cannot make the
// runs diverge.
TEST_P(GpuBatch, BatchedEqualsAlone) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config();
  const int64_t V = c.vocab_size;
  auto gpu = CudaBackend::random(c, 11, 0.08f);
  const std::vector<int64_t> prompt_len = {1, 9, 33, 64, 100, 250};
  const size_t N = prompt_len.size();
  const int decode_steps = 6;
  // Alone.
  std::vector<std::vector<std::vector<float>>> alone(N);  // [seq][step] logits
  std::vector<std::vector<int32_t>> next(N);               // [seq][step] token fed after that step
  for (size_t s = 0; s < N; ++s) {
    auto seq = gpu->new_sequence(512);
    std::vector<float> l;
    gpu->forward(*seq, prompt(prompt_len[s], V, int64_t(s)), false, l);
    for (int k = 0; k <= decode_steps; ++k) {
      alone[s].push_back(l);
      next[s].push_back(argmax(l));
      if (k < decode_steps) gpu->forward(*seq, std::span<const int32_t>(&next[s].back(), 1), false, l);
    }
  }
  // Batched: all prompts in one step, then decode steps of all sequences.
  auto pool = gpu->new_kv_pool(200, 16);
  Blocks blocks(200, 16, N, 5);
  std::vector<Step> steps;
  for (size_t s = 0; s < N; ++s) steps.push_back({s, prompt(prompt_len[s], V, int64_t(s)), 0, true});
  double worst = 0;
  for (int k = 0; k <= decode_steps; ++k) {
    SCOPED_TRACE(testing::Message() << "step " << k);
    std::vector<BatchEntry> e = entries_of(steps, blocks);
    std::vector<float> l;
    gpu->forward_batch(*pool, e, l);
    ASSERT_EQ(l.size(), N * size_t(V));
    for (size_t s = 0; s < N; ++s) {
      auto got = row(l, s, V);
      const std::vector<float>& ref = alone[s][size_t(k)];
      const double err = rel_error(got, ref);
      worst = std::max(worst, err);
      EXPECT_LT(err, kTolLogits) << "seq " << s;
      const float range = *std::max_element(ref.begin(), ref.end()) - *std::min_element(ref.begin(), ref.end());
      if (top2_gap(ref) > 0.02f * range) {
        EXPECT_EQ(argmax(got), argmax(ref)) << "seq " << s;
      }
    }
    std::vector<Step> dec;
    for (size_t s = 0; s < N; ++s)
      dec.push_back({s, {next[s][size_t(k)]}, steps[s].first + int64_t(steps[s].tokens.size()), true});
    steps = dec;
  }
  std::printf("[   info   ] worst batched-vs-alone logit error %.2e (tolerance %.0e)\n", worst, kTolLogits);
}

// A decode step of one sequence runs the fused decode GEMVs (K/V written by slot into the pool);
// the logits must be the unfused path's bits.
TEST_P(GpuBatch, FusedBatch1DecodeMatchesUnfused) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config();
  const int64_t V = c.vocab_size;
  CudaBackendOptions on, off;
  on.norm_fold = false;  // the folded norm rounds differently (backend_test.cpp: FoldedNormDecodeCloseToNormKernel)
  off.fused_decode = false;
  auto a = CudaBackend::random(c, 13, 0.05f, on), b = CudaBackend::random(c, 13, 0.05f, off);
  const int32_t NB = 64, BS = 16;
  auto pa = a->new_kv_pool(NB, BS), pb = b->new_kv_pool(NB, BS);
  Blocks blocks(NB, BS, 1, 3);
  std::vector<Step> steps = {{0, prompt(70, V, 1), 0, true}};
  for (int k = 0; k < 10; ++k) {
    SCOPED_TRACE(testing::Message() << "step " << k);
    std::vector<BatchEntry> e = entries_of(steps, blocks);
    std::vector<float> la, lb;
    a->forward_batch(*pa, e, la);
    b->forward_batch(*pb, e, lb);
    ASSERT_EQ(la, lb);
    steps = {{0, {argmax(la)}, steps[0].first + int64_t(steps[0].tokens.size()), true}};
  }
}

// A decode step of one sequence whose table spans more than 256 positions runs with the RMSNorms
// folded into the fused GEMVs (NormFoldRule::folds): not the norm kernel's bits, so within the
// GPU-vs-CPU tolerance of the unfolded step, and the folded kernels must have run.
TEST_P(GpuBatch, FoldedBatch1DecodeCloseToUnfolded) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config();
  const int64_t V = c.vocab_size;
  CudaBackendOptions off;
  off.norm_fold = false;
  auto a = CudaBackend::random(c, 17, 0.05f), b = CudaBackend::random(c, 17, 0.05f, off);
  const int32_t NB = 64, BS = 16;
  auto pa = a->new_kv_pool(NB, BS), pb = b->new_kv_pool(NB, BS);
  Blocks blocks(NB, BS, 1, 3);
  std::vector<Step> steps = {{0, prompt(300, V, 1), 0, true}};
  double worst = 0;
  for (int k = 0; k < 8; ++k) {
    SCOPED_TRACE(testing::Message() << "step " << k);
    if (k == 7) a->set_profiling(true);  // graphs are bypassed while profiling
    std::vector<BatchEntry> e = entries_of(steps, blocks);
    std::vector<float> la, lb;
    a->forward_batch(*pa, e, la);
    b->forward_batch(*pb, e, lb);
    if (k == 0) {
      ASSERT_EQ(la, lb) << "prefill (never folded)";
    } else {
      worst = std::max(worst, rel_error(la, lb));
      EXPECT_LT(rel_error(la, lb), kTolLogits);
    }
    steps = {{0, {argmax(lb)}, steps[0].first + int64_t(steps[0].tokens.size()), true}};
  }
  std::printf("[   info   ] folded vs unfolded batch-1 decode, worst logit error %.2e\n", worst);
  bool o_folded = false;
  for (const KernelStat& st : a->kernel_stats()) o_folded |= st.name.ends_with("o+norm.gemv");
  EXPECT_TRUE(o_folded);
}

// Decode steps of several batch sizes (buckets 1, 4, 8, 32, 64) and two table widths (sequences
// cross 256 positions): the graph backend warms each shape eagerly, captures it on its second use
// and replays it after; its logits must equal the eager backend's bit for bit.
TEST_P(GpuBatch, GraphReplayEqualsEager) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config();
  const int64_t V = c.vocab_size;
  auto a = CudaBackend::random(c, 5, 0.05f, CudaBackendOptions{512, true});
  auto b = CudaBackend::random(c, 5, 0.05f, CudaBackendOptions{512, false});
  const size_t N = 40;
  const int32_t NB = 1200, BS = 16;
  auto pa = a->new_kv_pool(NB, BS), pb = b->new_kv_pool(NB, BS);
  Blocks blocks(NB, BS, N, 9);
  std::vector<int64_t> len(N);
  std::vector<int32_t> last(N);
  {
    std::vector<Step> steps;
    for (size_t s = 0; s < N; ++s) steps.push_back({s, prompt(int64_t(3 + 7 * s), V, int64_t(s)), 0, true});
    std::vector<BatchEntry> e = entries_of(steps, blocks);
    std::vector<float> la, lb;
    a->forward_batch(*pa, e, la);
    b->forward_batch(*pb, e, lb);
    ASSERT_EQ(la, lb) << "prefill step";
    for (size_t s = 0; s < N; ++s) {
      len[s] = steps[s].first + int64_t(steps[s].tokens.size());
      last[s] = argmax(row(la, s, V));
    }
  }
  const size_t sizes[] = {1, 3, 5, 17, 40, 33};
  for (int round = 0; round < 4; ++round) {
    for (size_t n : sizes) {
      SCOPED_TRACE(testing::Message() << "round " << round << " batch " << n);
      std::vector<Step> steps;
      for (size_t i = 0; i < n; ++i) {
        const size_t s = (i * 7 + size_t(round)) % N;  // a different subset (and order) each time
        steps.push_back({s, {last[s]}, len[s], true});
      }
      std::vector<BatchEntry> e = entries_of(steps, blocks);
      std::vector<float> la, lb;
      a->forward_batch(*pa, e, la);
      b->forward_batch(*pb, e, lb);
      ASSERT_EQ(la.size(), n * size_t(V));
      ASSERT_EQ(la, lb);
      for (size_t i = 0; i < n; ++i) {
        len[steps[i].s] += 1;
        last[steps[i].s] = argmax(row(la, i, V));
      }
    }
  }
  EXPECT_GT(a->batch_graph_count(*pa), 0) << "the graph backend never replayed a graph";
  EXPECT_EQ(b->batch_graph_count(*pb), 0);
}

// Greedy rows: the argmax comes from the device and their logits are not copied back. The ids
// must equal the argmax of the full logits (same step on a second pool), for the mixed (eager)
// path and the decode (graph) path, and the non-greedy rows must be unchanged.
TEST_P(GpuBatch, DeviceArgmaxMatchesFullLogits) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config();
  const int64_t V = c.vocab_size;
  auto g = CudaBackend::random(c, 6, 0.05f);
  const size_t N = 40;
  auto pa = g->new_kv_pool(1200, 16), pb = g->new_kv_pool(1200, 16);
  Blocks blocks(1200, 16, N, 4);
  std::vector<Step> steps;
  for (size_t s = 0; s < N; ++s) steps.push_back({s, prompt(int64_t(2 + 5 * s), V, int64_t(s)), 0, true});
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round << " (" << steps.size() << " entries)");
    std::vector<BatchEntry> e = entries_of(steps, blocks);
    std::vector<float> la, lb;
    g->forward_batch(*pa, e, la);
    for (size_t i = 0; i < e.size(); ++i) e[i].greedy = i % 2 == 0;
    std::vector<int32_t> ids;
    g->forward_batch(*pb, e, lb, &ids);
    ASSERT_EQ(ids.size(), e.size());
    ASSERT_EQ(lb.size(), la.size());
    for (size_t i = 0; i < e.size(); ++i) {
      EXPECT_EQ(ids[i], argmax(row(la, i, V))) << "row " << i;
      if (!e[i].greedy) {
        EXPECT_TRUE(std::equal(row(la, i, V).begin(), row(la, i, V).end(), row(lb, i, V).begin()));
      }
    }
    // Next: decode steps of a shrinking subset (graph path for sizes up to 256).
    std::vector<Step> dec;
    for (size_t i = 0; i < steps.size(); i += size_t(1 + round % 2))
      dec.push_back({steps[i].s, {ids[i]}, steps[i].first + int64_t(steps[i].tokens.size()), true});
    steps = dec;
  }
}

TEST_P(GpuBatch, ProfilingCoversBatchSteps) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = config();
  auto g = CudaBackend::random(c, 1, 0.05f);
  g->set_profiling(true);
  auto pool = g->new_kv_pool(16, 16);
  Blocks blocks(16, 16, 2, 1);
  std::vector<Step> steps = {{0, prompt(30, c.vocab_size, 0), 0, true}, {1, {5}, 0, true}};
  std::vector<BatchEntry> e = entries_of(steps, blocks);
  std::vector<float> l;
  g->forward_batch(*pool, e, l);
  EXPECT_EQ(l.size(), 2 * size_t(c.vocab_size));
  bool saw_prefill = false, saw_decode = false;
  for (const KernelStat& st : g->kernel_stats()) {
    saw_prefill |= st.name == "attention.prefill";
    saw_decode |= st.name == "attention.decode";
  }
  EXPECT_TRUE(saw_prefill && saw_decode);
}

std::string config_name(const testing::TestParamInfo<int>& info) {
  return info.param == 0 ? "llama_gqa4_d64" : "d128_gqa2_bias_tied";
}
INSTANTIATE_TEST_SUITE_P(Configs, GpuBatch, testing::Values(0, 1), config_name);

// Bad requests throw kiln::Error before any kernel runs, and the backend keeps working.
TEST(GpuBatchInput, BadInputThrowsAndBackendSurvives) {
  KILN_REQUIRE_GPU();
  const ModelConfig c = batch_llama();
  auto g = CudaBackend::random(c, 3, 0.05f);
  auto other = CudaBackend::random(c, 3, 0.05f);
  EXPECT_THROW(g->new_kv_pool(0, 16), Error);
  EXPECT_THROW(g->new_kv_pool(8, 12), Error);  // not a power of two
  EXPECT_THROW(g->new_kv_pool(8, 0), Error);
  auto pool = g->new_kv_pool(8, 16);
  auto foreign = other->new_kv_pool(8, 16);
  const std::vector<int32_t> toks = {1, 2, 3};
  auto entry = [&](std::span<const int32_t> table, int64_t first = 0) {
    BatchEntry e;
    e.tokens = toks;
    e.first_position = first;
    e.block_table = table;
    e.want_logits = true;
    return e;
  };
  std::vector<float> l;
  const std::vector<int32_t> past_end = {8}, far = {1000}, negative = {-1}, ok = {2}, two = {3, 8};
  for (const std::vector<int32_t>* t : {&past_end, &far, &negative}) {
    std::vector<BatchEntry> e = {entry(*t)};
    EXPECT_THROW(g->forward_batch(*pool, e, l), Error) << "block " << (*t)[0];
  }
  {  // the second block (past the pool) is needed for positions 14 .. 16
    std::vector<BatchEntry> e = {entry(two, 14)};
    EXPECT_THROW(g->forward_batch(*pool, e, l), Error);
  }
  {  // a table too short for the positions
    std::vector<BatchEntry> e = {entry(ok, 15)};
    EXPECT_THROW(g->forward_batch(*pool, e, l), Error);
  }
  {  // a token outside the vocabulary
    const std::vector<int32_t> bad_tok = {int32_t(c.vocab_size)};
    BatchEntry e = entry(ok);
    e.tokens = bad_tok;
    std::vector<BatchEntry> es = {e};
    EXPECT_THROW(g->forward_batch(*pool, es, l), Error);
  }
  {  // two entries writing one slot
    std::vector<BatchEntry> e = {entry(ok), entry(ok)};
    EXPECT_THROW(g->forward_batch(*pool, e, l), Error);
  }
  {  // a pool of another backend
    std::vector<BatchEntry> e = {entry(ok)};
    EXPECT_THROW(g->forward_batch(*foreign, e, l), Error);
  }
  {  // no entries
    std::vector<BatchEntry> e;
    EXPECT_THROW(g->forward_batch(*pool, e, l), Error);
  }
  // Still healthy: a valid step runs and gives finite logits.
  std::vector<BatchEntry> e = {entry(ok)};
  ASSERT_NO_THROW(g->forward_batch(*pool, e, l));
  ASSERT_EQ(l.size(), size_t(c.vocab_size));
  for (float x : l) ASSERT_TRUE(std::isfinite(x));
}

TEST(GpuBatchInput, MemoryQueriesAndPoolSizing) {
  KILN_REQUIRE_GPU();
  const int64_t free_b = CudaBackend::free_device_memory(), total_b = CudaBackend::total_device_memory();
  EXPECT_GT(free_b, 0);
  EXPECT_LE(free_b, total_b);
  const ModelConfig c = batch_llama();
  auto g = CudaBackend::random(c, 3, 0.05f);
  const int64_t half = g->default_kv_cache_bytes(0.5);
  EXPECT_GT(half, 0);
  EXPECT_LE(half, total_b / 2);
  EXPECT_THROW(g->default_kv_cache_bytes(0.0), Error);
  EXPECT_THROW(g->default_kv_cache_bytes(1.5), Error);
  // The largest step's activations, reserved by the engine before it sizes its pool: logits for
  // the sequences' rows only (8 sequences: 8 rows, not one a token).
  const int64_t step_small = g->step_memory_bytes(512, 8), step_tokens = g->step_memory_bytes(16384, 8);
  const int64_t step_all_rows = g->step_memory_bytes(16384, 16384);
  EXPECT_GT(step_small, 0);
  EXPECT_GT(step_tokens, step_small);
  EXPECT_EQ(step_all_rows - step_tokens, (16384 - 16) * (c.vocab_size * 4 + c.hidden_size * 4))
      << "logits and the gathered residual: one row a sequence (16 at least)";
  EXPECT_EQ(g->kv_bytes_per_element(), 2);
  EXPECT_EQ(g->kv_bytes_per_token(), 2 * c.n_layers * c.kv_dim() * 2);
  const int32_t blocks = g->kv_blocks_for_budget(64ll << 20, 16);
  EXPECT_GT(blocks, 0);
  const int64_t before = CudaBackend::free_device_memory();
  auto pool = g->new_kv_pool(blocks, 16);
  const int64_t used = before - CudaBackend::free_device_memory();
  EXPECT_GE(used, int64_t(blocks) * 16 * g->kv_bytes_per_token());  // the blocks (and the scratch block)
  EXPECT_LE(used, (64ll << 20) + (32ll << 20));                      // ... and not much more
}

}  // namespace
}  // namespace kiln::gputest
