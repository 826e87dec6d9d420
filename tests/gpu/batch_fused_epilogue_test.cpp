// The batched steps' fused epilogues (CudaBackend::forward_batch on Hopper): the greedy head
// (the lm_head GEMM picks the ids, session 34) and RoPE with the K/V write in the qkv GEMM
// (session 35), each against the same steps through the unfused kernels.
#include "backend/cuda/cuda_backend.h"
#include "batch_test_util.h"
#include "gpu_test_util.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/matmul.h"

namespace kiln::gputest {
namespace {

// The greedy head (session 34): a step with more than 256 wanted rows, all greedy, takes the head
// GEMM that picks the ids in its epilogue and writes no logits (Impl::enqueue_head's GreedyHead). A
// vocabulary of 32000 makes the plan take its tiles. The ids must be the argmax of the logits of
// the same step on a second pool, for a step of 300 prompts and two steps of 300 decodes (eager:
// more than 256 entries), and no logits come back.
TEST(GpuBatchGreedyHead, IdsMatchFullLogits) {
  KILN_REQUIRE_GPU();
  ModelConfig c = batch_llama();
  c.name = "batch-greedy-head";
  c.vocab_size = 32000;
  c.n_layers = 1;
  const int64_t V = c.vocab_size;
  auto g = CudaBackend::random(c, 7, 0.05f);
  g->set_profiling(true);  // to see which head ran (the kernels are the same)
  const size_t N = 300;
  auto pa = g->new_kv_pool(1200, 16), pb = g->new_kv_pool(1200, 16);
  Blocks blocks(1200, 16, N, 5);
  std::vector<Step> steps;
  for (size_t s = 0; s < N; ++s) steps.push_back({s, prompt(int64_t(2 + s % 7), V, int64_t(s)), 0, true});
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    std::vector<BatchEntry> e = entries_of(steps, blocks);
    std::vector<float> la, lb;
    g->forward_batch(*pa, e, la);
    ASSERT_EQ(la.size(), N * size_t(V));
    for (BatchEntry& b : e) b.greedy = true;
    std::vector<int32_t> ids;
    g->forward_batch(*pb, e, lb, &ids);
    ASSERT_EQ(ids.size(), N);
    EXPECT_TRUE(lb.empty());
    for (size_t i = 0; i < N; ++i) EXPECT_EQ(ids[i], argmax(row(la, i, V))) << "row " << i;
    std::vector<Step> dec;
    for (size_t i = 0; i < N; ++i)
      dec.push_back({steps[i].s, {ids[i]}, steps[i].first + int64_t(steps[i].tokens.size()), true});
    steps = dec;
  }
  int64_t fused = 0, plain = 0;
  for (const KernelStat& st : g->kernel_stats()) {
    if (st.name == "lm_head+argmax.gemm") fused = st.calls;
    if (st.name == "lm_head.gemm") plain = st.calls;
  }
  EXPECT_EQ(plain, 3);  // every logits step
  // Every greedy step where the kernel can run (sm_90a); elsewhere the logits and the argmax kernel.
  EXPECT_EQ(fused, cuda::gemm_wgmma_available() ? 3 : 0);
}

// The qkv GEMM with RoPE in its epilogue (session 35): a mixed step of 2800 prompt rows with
// q_dim 1024 and kv_dim 256 (whole 256-column tiles) takes it on a 132-SM Hopper (H100 SXM, H200:
// the plan's 128x256 tiles at that M). Its logits, and the next decode step's (which reads the K/V
// it wrote), must be the bits of the same steps with the switch off (rope_qkv_slots after the
// GEMM), with a bf16 and an fp8 cache.
TEST(GpuBatchQkvRope, StepsMatchGemmThenRope) {
  KILN_REQUIRE_GPU();
  ModelConfig c = batch_llama();
  c.name = "batch-qkv-rope";
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.n_layers = 2;
  c.n_heads = 16;
  c.n_kv_heads = 4;
  c.context_length = 2048;
  const int64_t V = c.vocab_size;
  for (KvCacheFormat f : {KvCacheFormat::native, KvCacheFormat::fp8}) {
    SCOPED_TRACE(testing::Message() << "cache " << (f == KvCacheFormat::fp8 ? "fp8" : "bf16"));
    auto g = CudaBackend::random(c, 11, 0.05f);
    g->set_kv_cache_format(f);
    g->set_profiling(true);  // to see which qkv ran
    auto pa = g->new_kv_pool(400, 16), pb = g->new_kv_pool(400, 16);
    Blocks blocks(400, 16, 2, 9);
    std::vector<Step> prefill = {{0, prompt(1400, V, 1), 0, true}, {1, prompt(1400, V, 2), 0, true}};
    std::vector<Step> decode = {{0, {7}, 1400, true}, {1, {9}, 1400, true}};
    const std::vector<BatchEntry> e1 = entries_of(prefill, blocks), e2 = entries_of(decode, blocks);
    std::vector<float> fused[2], plain[2];
    cuda::set_gemm_rope_kv_enabled(true);
    g->forward_batch(*pa, e1, fused[0]);
    g->forward_batch(*pa, e2, fused[1]);
    cuda::set_gemm_rope_kv_enabled(false);
    g->forward_batch(*pb, e1, plain[0]);
    g->forward_batch(*pb, e2, plain[1]);
    cuda::set_gemm_rope_kv_enabled(true);
    ASSERT_EQ(fused[0].size(), 2 * size_t(V));
    EXPECT_EQ(fused[0], plain[0]) << "the prefill step's logits";
    EXPECT_EQ(fused[1], plain[1]) << "the decode step's logits (attention over the K/V the prefill wrote)";
    int64_t roped = 0, rope_kernel = 0;
    for (const KernelStat& st : g->kernel_stats()) {
      if (st.name == "qkv+rope.gemm") roped = st.calls;
      if (st.name == "rope_qkv") rope_kernel = st.calls;
    }
    // Where the plain product takes the 128x256 staged tiles (config 4: a 132-SM Hopper at M = 2800).
    const int64_t qkv_rows = c.q_dim() + 2 * c.kv_dim();
    if (cuda::gemm_wgmma_available() && cuda::gemm_wgmma_persistent_plan(2800, qkv_rows, c.hidden_size) == 4) {
      EXPECT_EQ(roped, c.n_layers) << "the fused GEMM ran for the prefill step";
    }
    // Every other step's layers (both decode steps, the switched-off prefill) ran rope_qkv.
    EXPECT_EQ(rope_kernel, 4 * c.n_layers - roped);
  }
}

}  // namespace
}  // namespace kiln::gputest
