// The analytic cost model on hand-computed cases: one Llama-3-8B layer at decode (batch 1) and at
// a 512-token prefill, bf16 weights and KV, fp32 residual. Numbers worked out by hand below.
#include <gtest/gtest.h>

#include "model/random_weights.h"
#include "profile/cost_model.h"

namespace kiln {
namespace {

double find(const std::vector<profile::OpCost>& ops, const std::string& name, bool flops, int which = 0) {
  for (const auto& op : ops)
    if (op.name == name && which-- == 0) return flops ? op.cost.flops : op.cost.bytes;
  ADD_FAILURE() << "no op " << name;
  return 0;
}

TEST(CostModel, Llama3_8bDecodeLayerByHand) {
  ModelConfig c = preset_config("llama3-8b");  // hidden 4096, 32/8 heads of 128, intermediate 14336
  auto ops = profile::step_ops(c, /*n_new=*/1, /*past=*/99, /*n_out=*/1);
  // qkv: W 6144x4096 bf16 = 50,331,648 B; x 4096 bf16 = 8,192 B; y 6144 bf16 = 12,288 B.
  EXPECT_DOUBLE_EQ(find(ops, "qkv.gemv", false), 50331648.0 + 8192 + 12288);
  EXPECT_DOUBLE_EQ(find(ops, "qkv.gemv", true), 2.0 * 6144 * 4096);
  // o: W 4096x4096 = 33,554,432 B; x 8,192 B; y added into the fp32 residual: 4096 * 8 = 32,768 B.
  EXPECT_DOUBLE_EQ(find(ops, "o.gemv", false), 33554432.0 + 8192 + 32768);
  // gate_up: W 28672x4096 = 234,881,024 B; x 8,192; y 28672 * 2 = 57,344.
  EXPECT_DOUBLE_EQ(find(ops, "gate_up.gemv", false), 234881024.0 + 8192 + 57344);
  // down: W 4096x14336 = 117,440,512 B; x 14336 * 2 = 28,672; residual 32,768.
  EXPECT_DOUBLE_EQ(find(ops, "down.gemv", false), 117440512.0 + 28672 + 32768);
  // attention at 100 visible positions: K and V rows of 8 heads x 128 x 2 B = 2,048 B each, so
  // 100 * 4,096 = 409,600 B; q and the output 4096 x 2 B each = 16,384 B. FLOPs: 4 * 100 * 4096.
  EXPECT_DOUBLE_EQ(find(ops, "attention.decode", false), 409600.0 + 16384);
  EXPECT_DOUBLE_EQ(find(ops, "attention.decode", true), 4.0 * 100 * 4096);
  // One layer's matrices hold 436,207,616 B = 218,103,808 bf16 weights: 2 FLOPs each at batch 1.
  double layer_flops = 0;
  for (const char* n : {"qkv.gemv", "o.gemv", "gate_up.gemv", "down.gemv"}) layer_flops += find(ops, n, true);
  EXPECT_DOUBLE_EQ(layer_flops, 2.0 * 218103808.0);
  // The whole step: 32 layers x 436.2 MB + the 1.05 GB lm_head = 15.01 GB of weights, plus KV and
  // activations. GPU.md's 16.06 GB also counts the 1.05 GB embedding table, of which a decode step
  // reads one row: the true floor at 4.25 TB/s is 3.54 ms, not 3.78.
  profile::Cost step = profile::step_cost(c, 1, 99, 1);
  EXPECT_NEAR(step.bytes / 1e9, 15.03, 0.01);
}

// Quantized projections (proj_weight) and a quantized head (head_weight, `--quant-head`) each
// change only their own matrices' weight bytes: int4 g128 at 0.5625 B a weight (data + fp32 scale and
// min per 128), the embedding row and activations unchanged.
TEST(CostModel, QuantizedHeadWidthAppliesToTheHeadOnly) {
  ModelConfig c = preset_config("llama3-8b");
  profile::Widths w;
  w.proj_weight = 0.5625;
  auto proj_only = profile::step_ops(c, 1, 99, 1, w);
  w.head_weight = 0.5625;
  auto head_too = profile::step_ops(c, 1, 99, 1, w);
  EXPECT_DOUBLE_EQ(find(proj_only, "qkv.gemv", false), find(head_too, "qkv.gemv", false));
  EXPECT_DOUBLE_EQ(find(proj_only, "qkv.gemv", false), 0.5625 * 6144 * 4096 + 8192 + 12288);
  // lm_head: W 128256x4096, x 4096 bf16 = 8,192 B, logits 128256 fp32 = 513,024 B.
  EXPECT_DOUBLE_EQ(find(proj_only, "lm_head.gemv", false), 2.0 * 128256 * 4096 + 8192 + 513024);
  EXPECT_DOUBLE_EQ(find(head_too, "lm_head.gemv", false), 0.5625 * 128256 * 4096 + 8192 + 513024);
}

// An 8-bit KV cache (kv = 1 + 4 / head_dim: a byte a value and an fp32 scale per head vector): the
// RoPE op's K/V write shrinks to it; its qkv read and q write stay bf16 (the CUDA backend charges the
// fused qkv GEMV and the quantizing rope_qkv this way).
TEST(CostModel, RopeKvWriteTakesTheCacheWidth) {
  ModelConfig c = preset_config("llama3-8b");  // q 4096, K/V 1024 each
  profile::Widths q8;
  q8.kv = 1.0 + 4.0 / 128;
  // qkv row 6144 x 2 B read, q 4096 x 2 B written; K/V: 2048 values x 2 B, or x 1 B + 16 heads x 4 B.
  EXPECT_DOUBLE_EQ(profile::rope_qkv(1, c).bytes, 12288.0 + 8192 + 4096);
  EXPECT_DOUBLE_EQ(profile::rope_qkv(1, c, q8).bytes, 12288.0 + 8192 + 2048 + 64);
}

TEST(CostModel, Llama3_8bPrefill512LayerByHand) {
  ModelConfig c = preset_config("llama3-8b");
  auto ops = profile::step_ops(c, 512, 0, 1);
  // qkv as a GEMM: W 50,331,648 B + x 512*4096*2 = 4,194,304 + y 512*6144*2 = 6,291,456.
  EXPECT_DOUBLE_EQ(find(ops, "qkv.gemm", false), 50331648.0 + 4194304 + 6291456);
  EXPECT_DOUBLE_EQ(find(ops, "qkv.gemm", true), 2.0 * 512 * 6144 * 4096);  // 25.77 GFLOP
  // Causal attention over 512 tokens: 512 * 513 / 2 = 131,328 (query, key) pairs, 4 * 4096 FLOPs each.
  EXPECT_DOUBLE_EQ(find(ops, "attention.prefill", true), 4.0 * 131328 * 4096);
  // K/V: 512 rows * 4,096 B = 2,097,152; q and out: 2 * 512 * 4096 * 2 = 8,388,608.
  EXPECT_DOUBLE_EQ(find(ops, "attention.prefill", false), 2097152.0 + 8388608);
  // The logits only for the last token: a GEMV over the 128256x4096 head.
  EXPECT_DOUBLE_EQ(find(ops, "lm_head.gemv", true), 2.0 * 128256 * 4096);
  // The step: 32 layers x 218,103,808 weights x 2 x 512 tokens = 7.1467e12, + attention
  // 32 x 4 x 131,328 x 4096 = 6.885e10, + the head for one token 1.05e9 (+ norms, rope, silu: ~1e9).
  profile::Cost step = profile::step_cost(c, 512, 0, 1);
  EXPECT_NEAR(step.flops / 1e12, 7.1467 + 0.0689 + 0.0011, 0.003);
}

}  // namespace
}  // namespace kiln

namespace kiln::profile {
namespace {

// A batched decode step reads the weights once and each sequence's KV once: 64 sequences cost
// one sequence's step plus 63 more attention reads and 63 more rows of activations.
TEST(CostModel, BatchedDecodeReadsWeightsOnceAndEachKvOnce) {
  const ModelConfig c = preset_config("llama3-8b");
  const std::vector<SeqShape> batch(64, SeqShape{1, 1000});
  const Cost one = step_cost(c, 1, 1000, 1);
  const Cost many = batch_cost(c, batch, 64);
  const double attention_extra = 63 * attention(1, 1000, c).bytes * double(c.n_layers);
  // Weights dominate: the batch costs far less than 64 single steps.
  EXPECT_LT(many.bytes, 1.5 * one.bytes + attention_extra);
  EXPECT_GT(many.bytes, one.bytes + attention_extra);
  EXPECT_NEAR(many.flops, 64 * one.flops, 1e-6 * 64 * one.flops);
  // A mixed step: attention of the prefill and decode parts are separate ops, matrix products one.
  const auto ops = batch_ops(c, {{1, 100}, {300, 0}}, 2);
  int decode = 0, prefill = 0, gemm = 0;
  for (const auto& op : ops) {
    decode += op.name == "attention.decode";
    prefill += op.name == "attention.prefill";
    gemm += op.name == "qkv.gemm";
  }
  EXPECT_EQ(decode, c.n_layers);
  EXPECT_EQ(prefill, c.n_layers);
  EXPECT_EQ(gemm, c.n_layers);
}

}  // namespace
}  // namespace kiln::profile
