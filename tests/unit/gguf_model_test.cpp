// config_from_gguf and weights_from_gguf on a tiny built model: a good file loads with the values
// written; metadata that disagrees with a tensor's shape, a missing tensor or key, and an
// unsupported architecture are rejected with the offending name in the message.
#include <gtest/gtest.h>

#include "expect_error.h"

#include <string>

#include "core/thread_pool.h"
#include "gguf_builder.h"
#include "kiln/error.h"
#include "backend/cpu/ops.h"
#include "model/gguf/gguf_model.h"

namespace kiln::gguf {
namespace {

using namespace kiln::gguf::testing;

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

// Loads config and weights, expecting a kiln::Error with `code` whose message contains `needle`.
void expect_load_error(GgufBuilder b, const std::string& needle, Errc code = Errc::invalid_model) {
  Loaded m(b.build());
  test::expect_error([&] { weights_from_gguf(m.file, config_from_gguf(m.file), pool()); }, needle, code);
}

// The tiny model with tensor `name` replaced by one of shape `ne`.
GgufBuilder with_tensor_shape(const std::string& name, std::vector<uint64_t> ne, TinyModel m = {}) {
  GgufBuilder b = tiny_model(m);
  b.remove_tensor(name);
  add_tiny_tensor(b, name, std::move(ne));
  return b;
}

void expect_matrix(const HostMatrix& got, const std::string& name, int64_t rows, int64_t cols) {
  SCOPED_TRACE(name);
  ASSERT_EQ(got.rows, rows);
  ASSERT_EQ(got.cols, cols);
  ASSERT_EQ(got.data.size(), size_t(rows * cols));
  for (size_t i = 0; i < got.data.size(); ++i) ASSERT_EQ(got.data[i], tiny_value(name, i)) << "element " << i;
}

TEST(GgufModel, TinyLlamaLoads) {
  Loaded m(tiny_model().build());
  ModelConfig c = config_from_gguf(m.file);
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.vocab_size, 32);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.context_length, 256);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.rope.theta, 500000.0f);
  EXPECT_EQ(c.rope.rot_dim, 16);
  EXPECT_EQ(c.rope.style, RopeStyle::interleaved);  // llama.cpp permuted llama's Q/K rows
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);

  ModelWeights w = weights_from_gguf(m.file, c, pool());
  expect_matrix(w.embed, "token_embd.weight", 32, 64);
  expect_matrix(w.final_norm, "output_norm.weight", 1, 64);
  expect_matrix(w.lm_head, "output.weight", 32, 64);
  ASSERT_EQ(w.layers.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    const LayerWeights& L = w.layers[size_t(l)];
    expect_matrix(L.attn_norm, p + "attn_norm.weight", 1, 64);
    expect_matrix(L.wq, p + "attn_q.weight", 64, 64);
    expect_matrix(L.wk, p + "attn_k.weight", 32, 64);
    expect_matrix(L.wv, p + "attn_v.weight", 32, 64);
    expect_matrix(L.wo, p + "attn_output.weight", 64, 64);
    expect_matrix(L.ffn_norm, p + "ffn_norm.weight", 1, 64);
    expect_matrix(L.w_gate, p + "ffn_gate.weight", 128, 64);
    expect_matrix(L.w_up, p + "ffn_up.weight", 128, 64);
    expect_matrix(L.w_down, p + "ffn_down.weight", 64, 128);
    EXPECT_TRUE(L.bq.empty());
  }
}

TEST(GgufModel, TiedEmbeddings) {
  Loaded m(tiny_model({.tied = true}).build());
  ModelConfig c = config_from_gguf(m.file);
  EXPECT_TRUE(c.tied_embeddings);
  ModelWeights w = weights_from_gguf(m.file, c, pool());
  EXPECT_TRUE(w.lm_head.empty());
  EXPECT_EQ(&w.output(), &w.embed);
}

TEST(GgufModel, Qwen2WithBiases) {
  Loaded m(tiny_model({.arch = "qwen2", .qkv_bias = true}).build());
  ModelConfig c = config_from_gguf(m.file);
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.rope.style, RopeStyle::half);  // qwen2 GGUFs keep HF's layout
  ModelWeights w = weights_from_gguf(m.file, c, pool());
  expect_matrix(w.layers[1].bq, "blk.1.attn_q.bias", 1, 64);
  expect_matrix(w.layers[1].bk, "blk.1.attn_k.bias", 1, 32);
}

// Quantized weights are dequantized row by row: checks the row stride in bytes.
TEST(GgufModel, Q8_0WeightsAreDequantizedPerRow) {
  GgufBuilder b = tiny_model();
  b.remove_tensor("blk.0.ffn_down.weight");
  Bytes data;  // 64 rows of 128 = 4 blocks each; block k of row r: d = 1, q = (r + k + j) % 100 - 50
  for (int r = 0; r < 64; ++r)
    for (int k = 0; k < 4; ++k) {
      put<uint16_t>(data, 0x3c00);
      for (int j = 0; j < 32; ++j) put<int8_t>(data, int8_t((r + k + j) % 100 - 50));
    }
  b.tensor("blk.0.ffn_down.weight", {128, 64}, gt::Q8_0, data);
  Loaded m(b.build());
  ModelConfig c = config_from_gguf(m.file);
  ModelWeights w = weights_from_gguf(m.file, c, pool());
  const HostMatrix& down = w.layers[0].w_down;
  ASSERT_EQ(down.rows, 64);
  ASSERT_EQ(down.cols, 128);
  for (int r = 0; r < 64; ++r)
    for (int col = 0; col < 128; ++col)
      ASSERT_EQ(down.row(r)[col], float((r + col / 32 + col % 32) % 100 - 50)) << r << "," << col;
}

// ---------------------------------------------------------------------------------------------
// Shapes that disagree with the config name the tensor

TEST(GgufModel, RejectsATensorWhoseShapeDisagrees) {
  expect_load_error(with_tensor_shape("blk.1.ffn_up.weight", {64, 96}),
                    "tensor 'blk.1.ffn_up.weight' has shape [64, 96] but the model config implies [64, 128]");
  // Transposed: ne[0] must be the input (contiguous) dimension.
  expect_load_error(with_tensor_shape("blk.0.attn_k.weight", {32, 64}), "tensor 'blk.0.attn_k.weight' has shape [32, 64]");
  expect_load_error(with_tensor_shape("blk.0.attn_norm.weight", {64, 1}), "tensor 'blk.0.attn_norm.weight'");
  expect_load_error(with_tensor_shape("output.weight", {64, 31}), "tensor 'output.weight'");
  expect_load_error(with_tensor_shape("blk.1.attn_output.weight", {64, 64, 1}), "tensor 'blk.1.attn_output.weight'");
}

TEST(GgufModel, RejectsMetadataThatDisagreesWithTheTensors) {
  GgufBuilder b = tiny_model();
  b.remove_kv("llama.embedding_length").kv_u32("llama.embedding_length", 128);
  expect_load_error(b, "tensor 'token_embd.weight' has shape [64, 32] but the model config implies [128, 32]");

  GgufBuilder kv = tiny_model();
  kv.remove_kv("llama.attention.head_count_kv").kv_u32("llama.attention.head_count_kv", 4);
  expect_load_error(kv, "tensor 'blk.0.attn_k.weight'");

  GgufBuilder vocab = tiny_model();
  vocab.kv_u32("llama.vocab_size", 33);
  expect_load_error(vocab, "tensor 'token_embd.weight'");
}

TEST(GgufModel, RejectsAMissingTensor) {
  GgufBuilder b = tiny_model();
  b.remove_tensor("blk.1.attn_v.weight");
  expect_load_error(b, "GGUF lacks tensor 'blk.1.attn_v.weight'");
  GgufBuilder q = tiny_model({.qkv_bias = true});
  q.remove_tensor("blk.0.attn_k.bias");
  expect_load_error(q, "GGUF lacks tensor 'blk.0.attn_k.bias'");
  GgufBuilder e = tiny_model();
  e.remove_tensor("token_embd.weight");
  expect_load_error(e, "token_embd.weight");
}

// A block count far beyond the tensors present must fail on the first missing layer, not first
// allocate per-layer storage for all of them.
TEST(GgufModel, RejectsABlockCountBeyondTheTensors) {
  GgufBuilder b = tiny_model();
  b.remove_kv("llama.block_count").kv_u32("llama.block_count", 1u << 30);
  expect_load_error(b, "GGUF lacks tensor 'blk.2.attn_norm.weight'");
}

TEST(GgufModel, RejectsAMissingOrMistypedKey) {
  GgufBuilder b = tiny_model();
  b.remove_kv("llama.feed_forward_length");
  expect_load_error(b, "GGUF metadata lacks 'llama.feed_forward_length'");
  GgufBuilder s = tiny_model();
  s.remove_kv("llama.block_count").kv_string("llama.block_count", "2");
  expect_load_error(s, "GGUF key 'llama.block_count' should be an integer");
  GgufBuilder z = tiny_model();
  z.remove_kv("llama.attention.head_count").kv_u32("llama.attention.head_count", 0);
  expect_load_error(z, "head_count is 0");
  GgufBuilder r = tiny_model();  // 2^32 + 16 must not be read as 16
  r.remove_kv("llama.rope.dimension_count").kv_u64("llama.rope.dimension_count", (uint64_t(1) << 32) + 16);
  expect_load_error(r, "llama.rope.dimension_count is 4294967312");
}

TEST(GgufModel, RejectsAnUnsupportedArchitecture) {
  expect_load_error(tiny_model({.arch = "gpt2"}), "GGUF architecture 'gpt2' is not supported", Errc::unsupported);
  GgufBuilder none = tiny_model();
  none.remove_kv("general.architecture");
  expect_load_error(none, "GGUF architecture '' is not supported", Errc::unsupported);
}

TEST(GgufModel, RejectsATensorTypeItCannotConvert) {
  GgufBuilder b = tiny_model();
  b.remove_tensor("blk.0.ffn_down.weight");
  b.tensor("blk.0.ffn_down.weight", {128, 64}, 6 /* Q5_0 */, Bytes(64 * 4 * 22, 0));
  expect_load_error(b, "tensor 'blk.0.ffn_down.weight' has type Q5_0, which kiln cannot load yet", Errc::unsupported);
}

}  // namespace
}  // namespace kiln::gguf

namespace kiln::gguf {
namespace {

using testing::tiny_model;

TEST(GgufModel, Llama31RopeFreqsAreLoadedAsFactors) {
  auto b = tiny_model();  // head_dim 16: 8 rotation pairs
  std::vector<float> factors = {1, 1, 1, 2, 4, 8, 8, 8};
  b.tensor_f32("rope_freqs.weight", {8}, factors);
  auto bytes = b.build();
  auto file = GgufFile::parse(bytes);
  ModelConfig c = config_from_gguf(file);
  EXPECT_EQ(c.rope.freq_factors, factors);
  RopeConfig plain = c.rope;
  plain.freq_factors.clear();
  EXPECT_FLOAT_EQ(cpu::rope_inv_freq(c.rope, 5), cpu::rope_inv_freq(plain, 5) / 8);
}

TEST(GgufModel, RopeFreqsOfTheWrongLengthAreRejected) {
  auto b = tiny_model();
  b.tensor_f32("rope_freqs.weight", {7}, std::vector<float>(7, 1.0f));
  auto bytes = b.build();
  auto file = GgufFile::parse(bytes);
  test::expect_error([&] { config_from_gguf(file); }, "rope_freqs.weight", Errc::invalid_model);
}

}  // namespace
}  // namespace kiln::gguf
