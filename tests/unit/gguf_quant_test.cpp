// GGUF weights keep their quantized form: Q8_0/Q4_0/Q4_1/Q4_K fill HostMatrix::quant losslessly,
// kiln's own types load from their tensors and companions, the writer round-trips a model, and
// bad kiln tensors are errors naming the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "expect_error.h"
#include "gguf_builder.h"
#include "model/gguf/dequantize.h"
#include "model/gguf/gguf_model.h"
#include "model/gguf/gguf_names.h"
#include "model/gguf/gguf_quant.h"
#include "model/gguf/gguf_writer.h"
#include "quant/quantize.h"

namespace kiln::gguf {
namespace {

using namespace kiln::gguf::testing;

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

// Random blocks of a ggml type: random bytes, with every fp16 scale replaced by a finite value.
Bytes random_blocks(uint32_t type, int64_t n_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  const auto traits = *type_traits(type);
  Bytes b(size_t(n_blocks) * traits.block_bytes);
  for (auto& x : b) x = uint8_t(rng());
  const int n_halves = GgmlType(type) == GgmlType::Q4_1 || GgmlType(type) == GgmlType::Q4_K ? 2 : 1;
  for (int64_t k = 0; k < n_blocks; ++k)
    for (int h = 0; h < n_halves; ++h) {
      const uint16_t v = f32_to_fp16(d(rng));
      std::memcpy(b.data() + size_t(k) * traits.block_bytes + 2 * h, &v, 2);
    }
  return b;
}

TEST(GgufQuant, NativeBlocksFillTheQuantizedFormLosslessly) {
  const struct { uint32_t type; QuantFormat format; } cases[] = {
      {gt::Q8_0, QuantFormat::int8}, {gt::Q4_0, QuantFormat::int4}, {gt::Q4_1, QuantFormat::int4},
      {gt::Q4_K, QuantFormat::int4}};
  const int64_t rows = 6, cols = 512;
  for (const auto& c : cases) {
    SCOPED_TRACE(type_traits(c.type)->name);
    const auto traits = *type_traits(c.type);
    Bytes data = random_blocks(c.type, rows * cols / traits.block_elems, c.type);
    GgufBuilder b;
    b.tensor("w", {uint64_t(cols), uint64_t(rows)}, c.type, data);
    Loaded f(b.build());
    const TensorInfo& t = f.file.tensors()[0];
    auto q = quantized_form(f.file, t, rows, cols);
    ASSERT_TRUE(q.has_value());
    EXPECT_EQ(q->format, c.format);
    EXPECT_EQ(q->group_size, 32);
    quant::validate(*q, "w");
    std::vector<float> want(size_t(rows * cols)), got(want.size());
    dequantize_row(c.type, t.data, want.data(), rows * cols);
    quant::dequantize(*q, got.data());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;  // bit for bit
  }
}

TEST(GgufQuant, DenseTypesHaveNoQuantizedForm) {
  GgufBuilder b;
  b.tensor_f32("w", {32, 2}, std::vector<float>(64, 1.0f));
  Loaded f(b.build());
  EXPECT_FALSE(quantized_form(f.file, f.file.tensors()[0], 2, 32).has_value());
}

TEST(GgufQuant, LoadedQ4_1WeightsCarryTheirQuantizedForm) {
  TinyModel tm;
  GgufBuilder b = tiny_model(tm);
  b.remove_tensor("blk.1.ffn_up.weight");
  Bytes data = random_blocks(gt::Q4_1, int64_t(tm.intermediate * tm.hidden / 32), 9);
  b.tensor("blk.1.ffn_up.weight", {tm.hidden, tm.intermediate}, gt::Q4_1, data);
  Loaded m(b.build());
  ModelWeights w = weights_from_gguf(m.file, config_from_gguf(m.file), pool());
  const HostMatrix& up = w.layers[1].w_up;
  ASSERT_EQ(up.quant.format, QuantFormat::int4);
  std::vector<float> back(up.data.size());
  quant::dequantize(up.quant, back.data());
  EXPECT_EQ(back, up.data);
  EXPECT_TRUE(w.layers[0].w_up.quant.empty());  // F32 stays dense
}

// The tiny model with blk.0.attn_q.weight as a kiln tensor of `format`.
GgufBuilder with_kiln_q(QuantFormat format, bool version_key = true) {
  TinyModel tm;
  GgufBuilder b = tiny_model(tm);
  b.remove_tensor("blk.0.attn_q.weight");
  std::vector<float> w(size_t(tm.hidden * tm.hidden));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(float(i)) * 0.1f;
  QuantizedMatrix q = format == QuantFormat::int8   ? quant::quantize_int8(w.data(), 64, 64)
                      : format == QuantFormat::int4 ? quant::quantize_int4(w.data(), 64, 64, 32)
                                                    : quant::quantize_fp8(w.data(), 64, 64);
  const uint32_t type = format == QuantFormat::int8 ? 1024 : format == QuantFormat::int4 ? 1025 : 1026;
  b.tensor("blk.0.attn_q.weight", {64, 64}, type, q.q);
  b.tensor("blk.0.attn_q.weight.scales", {uint64_t(q.groups()), 64}, gt::F32, to_bytes(q.scales));
  if (!q.mins.empty()) b.tensor("blk.0.attn_q.weight.mins", {uint64_t(q.groups()), 64}, gt::F32, to_bytes(q.mins));
  if (version_key) b.kv_u32("kiln.quantization.version", 1);
  return b;
}

TEST(GgufQuant, KilnTypesLoadWithTheirScales) {
  for (QuantFormat f : {QuantFormat::int8, QuantFormat::int4, QuantFormat::fp8}) {
    SCOPED_TRACE(std::string(quant::format_name(f)));
    Loaded m(with_kiln_q(f).build());
    ModelWeights w = weights_from_gguf(m.file, config_from_gguf(m.file), pool());
    const HostMatrix& q = w.layers[0].wq;
    ASSERT_EQ(q.quant.format, f);
    EXPECT_EQ(q.quant.group_size, f == QuantFormat::int4 ? 32 : 64);
    std::vector<float> back(q.data.size());
    quant::dequantize(q.quant, back.data());
    EXPECT_EQ(back, q.data);
    for (size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], std::sin(float(i)) * 0.1f, 0.01f) << i;
  }
}

void expect_load_error(GgufBuilder b, const std::string& needle) {
  Loaded m(b.build());
  test::expect_error([&] { weights_from_gguf(m.file, config_from_gguf(m.file), pool()); }, needle,
                     Errc::invalid_model);
}

TEST(GgufQuantBad, KilnTensorWithoutItsScales) {
  expect_load_error(with_kiln_q(QuantFormat::int8).remove_tensor("blk.0.attn_q.weight.scales"),
                    "tensor 'blk.0.attn_q.weight' (KILN_INT8) lacks its companion 'blk.0.attn_q.weight.scales'");
  expect_load_error(with_kiln_q(QuantFormat::int4).remove_tensor("blk.0.attn_q.weight.mins"),
                    "lacks its companion 'blk.0.attn_q.weight.mins'");
}

TEST(GgufQuantBad, ScalesOfTheWrongShapeOrType) {
  GgufBuilder b = with_kiln_q(QuantFormat::int8);
  b.remove_tensor("blk.0.attn_q.weight.scales").tensor_f32("blk.0.attn_q.weight.scales", {1, 63},
                                                           std::vector<float>(63, 1.0f));
  expect_load_error(b, "tensor 'blk.0.attn_q.weight.scales' must be F32 of shape [groups, 64]");
  b = with_kiln_q(QuantFormat::int8);
  b.remove_tensor("blk.0.attn_q.weight.scales").tensor("blk.0.attn_q.weight.scales", {1, 64}, gt::F16, Bytes(128));
  expect_load_error(b, "must be F32");
  b = with_kiln_q(QuantFormat::int4);  // 3 groups do not divide 64 columns
  b.remove_tensor("blk.0.attn_q.weight.scales").tensor_f32("blk.0.attn_q.weight.scales", {3, 64},
                                                           std::vector<float>(192, 1.0f));
  b.remove_tensor("blk.0.attn_q.weight.mins").tensor_f32("blk.0.attn_q.weight.mins", {3, 64},
                                                         std::vector<float>(192, 1.0f));
  expect_load_error(b, "tensor 'blk.0.attn_q.weight': 3 groups do not divide its 64 columns");
  b = with_kiln_q(QuantFormat::int4);
  b.remove_tensor("blk.0.attn_q.weight.mins").tensor_f32("blk.0.attn_q.weight.mins", {3, 64},
                                                         std::vector<float>(192, 1.0f));
  expect_load_error(b, "blk.0.attn_q.weight.mins' must be F32 of shape [groups, 64] with 2 groups");
}

TEST(GgufQuantBad, NonFiniteScale) {
  GgufBuilder b = with_kiln_q(QuantFormat::fp8);
  std::vector<float> s(64, 0.01f);
  s[7] = std::numeric_limits<float>::quiet_NaN();
  b.remove_tensor("blk.0.attn_q.weight.scales").tensor_f32("blk.0.attn_q.weight.scales", {1, 64}, s);
  expect_load_error(b, "tensor 'blk.0.attn_q.weight': scale or min 7 is not finite");
}

TEST(GgufQuantBad, KilnTensorOfABadShapeOrWithoutTheVersionKey) {
  // The reader's block check covers kiln types: an int4 row holds whole bytes (2 elements each).
  GgufBuilder b = with_kiln_q(QuantFormat::int4);
  b.remove_tensor("blk.0.attn_q.weight").tensor("blk.0.attn_q.weight", {63, 64}, 1025, Bytes(2016));
  const Bytes bytes = b.build();
  test::expect_error([&] { GgufFile::parse(std::span<const uint8_t>(bytes)); },
                     "row length 63 is not a multiple of the KILN_INT4 block size 2", Errc::invalid_model);
  expect_load_error(with_kiln_q(QuantFormat::int8, false),
                    "has kiln's type KILN_INT8 but the file lacks kiln.quantization.version = 1");
}

TEST(GgufWriter, RoundTripsMetadataAndTensors) {
  Loaded in(with_kiln_q(QuantFormat::int4)
                .kv_string_array("tokenizer.ggml.tokens", {"a", "b", "<s>"})
                .kv_array<int32_t>("tokenizer.ggml.token_type", vt::I32, {1, 1, 3})
                .kv_array<float>("tokenizer.ggml.scores", vt::F32, {-1.5f, 0.25f, 0.0f})
                .kv_bool("tokenizer.ggml.add_bos_token", true)
                .kv_u64("some.u64", 1ull << 40)
                .kv_i8("some.i8", -5)
                .kv_f64("some.f64", 0.1)
                .build());
  GgufWriter w;
  for (const auto& [k, v] : in.file.metadata()) w.set(k, v);
  for (const TensorInfo& t : in.file.tensors())
    w.add_tensor(t.name, t.ne, t.type, std::span<const uint8_t>(t.data, t.n_bytes));
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_writer_test.gguf").string();
  w.write(path);
  GgufFile out = GgufFile::open(path);
  ASSERT_EQ(out.metadata().size(), in.file.metadata().size());
  for (const auto& [k, v] : in.file.metadata()) {
    SCOPED_TRACE(k);
    const Value* o = out.find(k);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->type, v.type);
    EXPECT_EQ(o->array_type, v.array_type);
    EXPECT_EQ(o->i, v.i);
    EXPECT_EQ(o->u, v.u);
    EXPECT_EQ(o->f, v.f);
    EXPECT_EQ(o->str, v.str);
    EXPECT_EQ(o->strings, v.strings);
    EXPECT_EQ(o->numbers, v.numbers);
  }
  ASSERT_EQ(out.tensors().size(), in.file.tensors().size());
  for (const TensorInfo& t : in.file.tensors()) {
    const TensorInfo* o = out.find_tensor(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(o->type, t.type);
    EXPECT_EQ(o->ne, t.ne);
    ASSERT_EQ(o->n_bytes, t.n_bytes);
    EXPECT_EQ(std::memcmp(o->data, t.data, t.n_bytes), 0) << t.name;
  }
  std::filesystem::remove(path);
}

TEST(GgufNames, CoverEveryTensorOfTheModel) {
  Loaded m(tiny_model().build());
  ModelWeights w = weights_from_gguf(m.file, config_from_gguf(m.file), pool());
  auto named = named_tensors(w);
  EXPECT_EQ(named.size(), m.file.tensors().size());
  for (const TensorInfo& t : m.file.tensors()) EXPECT_TRUE(named.contains(t.name)) << t.name;
  EXPECT_TRUE(is_linear_weight("blk.3.ffn_down.weight"));
  EXPECT_FALSE(is_linear_weight("blk.3.ffn_norm.weight"));
  EXPECT_FALSE(is_linear_weight("token_embd.weight"));
}

}  // namespace
}  // namespace kiln::gguf
