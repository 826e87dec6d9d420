#include "model/gguf/gguf_model.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/check.h"
#include "model/gguf/dequantize.h"
#include "model/gguf/gguf_quant.h"
#include "model/layer_tensors.h"
#include "quant/quantize.h"

namespace kiln::gguf {
namespace {

int64_t require_int(const GgufFile& f, const std::string& key) {
  auto v = f.get_int(key);
  KILN_CHECK(v.has_value(), invalid_model, "GGUF metadata lacks '{}'", key);
  return *v;
}

// Reads tensor `name`, which must have ne == [cols, rows] (ne[0] contiguous), into fp32.
HostMatrix read_matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols, ThreadPool& pool,
                       bool optional = false) {
  const TensorInfo* t = f.find_tensor(name);
  if (!t) {
    KILN_CHECK(optional, invalid_model, "GGUF lacks tensor '{}'", name);
    return {};
  }
  bool matches = rows == 1 ? (t->ne.size() == 1 && int64_t(t->ne[0]) == cols)
                           : (t->ne.size() == 2 && int64_t(t->ne[0]) == cols && int64_t(t->ne[1]) == rows);
  KILN_CHECK(matches, invalid_model, "tensor '{}' has shape {} but the model config implies [{}, {}]", name,
             t->shape_string(), cols, rows);
  auto traits = type_traits(t->type);
  HostMatrix m(rows, cols);
  // Quantized weights keep their quantized form too (for the GPU's native kernels); `data` is
  // always the dequantized fp32 the CPU computes with.
  if (auto q = quantized_form(f, *t, rows, cols)) {
    m.quant = std::move(*q);
    if (is_kiln_type(t->type)) {
      pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) quant::dequantize_row(m.quant, r, m.data.data() + r * cols);
      });
      return m;
    }
  }
  KILN_CHECK(can_dequantize(t->type), unsupported, "tensor '{}' has type {}, which kiln cannot load yet", name,
             traits->name);
  uint64_t row_bytes = uint64_t(cols) / traits->block_elems * traits->block_bytes;
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequantize_row(t->type, t->data + r * row_bytes, m.data.data() + r * cols, cols);
  });
  return m;
}

}  // namespace

ModelConfig config_from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.architecture = f.get_string("general.architecture").value_or("");
  KILN_CHECK(c.architecture == "llama" || c.architecture == "qwen2", unsupported,
             "GGUF architecture '{}' is not supported (kiln runs llama and qwen2)", c.architecture);
  const std::string& a = c.architecture;
  c.name = f.get_string("general.name").value_or("");
  c.hidden_size = require_int(f, a + ".embedding_length");
  c.intermediate_size = require_int(f, a + ".feed_forward_length");
  c.n_layers = require_int(f, a + ".block_count");
  c.n_heads = require_int(f, a + ".attention.head_count");
  c.n_kv_heads = f.get_int(a + ".attention.head_count_kv").value_or(c.n_heads);
  c.context_length = require_int(f, a + ".context_length");
  KILN_CHECK(c.n_heads > 0, invalid_model, "GGUF: attention.head_count is {}", c.n_heads);
  c.head_dim = f.get_int(a + ".attention.key_length").value_or(c.hidden_size / c.n_heads);
  c.rms_eps = float(f.get_float(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope.theta = float(f.get_float(a + ".rope.freq_base").value_or(10000.0));
  // Range-check before narrowing to int (validate() checks it against head_dim): 2^32 + 64 would
  // otherwise pass as 64.
  int64_t rot_dim = f.get_int(a + ".rope.dimension_count").value_or(c.head_dim);
  KILN_CHECK(rot_dim > 0 && rot_dim <= std::numeric_limits<int>::max(), invalid_model,
             "GGUF {}.rope.dimension_count is {}, out of range", a, rot_dim);
  c.rope.rot_dim = int(rot_dim);
  // llama.cpp's converter permutes llama Q/K rows to rotate adjacent pairs; qwen2 keeps HF's halves.
  c.rope.style = a == "llama" ? RopeStyle::interleaved : RopeStyle::half;
  if (const TensorInfo* t = f.find_tensor("rope_freqs.weight")) {
    // Llama 3.1 GGUFs: one divisor per rotation pair, precomputed by the converter.
    KILN_CHECK(t->type == uint32_t(GgmlType::F32) && t->ne.size() == 1 && int64_t(t->ne[0]) == c.rope.rot_dim / 2,
               invalid_model, "tensor 'rope_freqs.weight' must be F32 of {} elements (rope dimension / 2), got {} {}",
               c.rope.rot_dim / 2, type_traits(t->type) ? type_traits(t->type)->name : "?", t->shape_string());
    c.rope.freq_factors.resize(size_t(t->ne[0]));
    dequantize_row(t->type, t->data, c.rope.freq_factors.data(), int64_t(t->ne[0]));
    for (float v : c.rope.freq_factors)
      KILN_CHECK(std::isfinite(v) && v > 0, invalid_model, "rope_freqs.weight holds {}: factors must be positive", v);
  }
  const TensorInfo* embd = f.find_tensor("token_embd.weight");
  KILN_CHECK(embd && embd->ne.size() == 2, invalid_model, "GGUF lacks a 2-D tensor 'token_embd.weight'");
  c.vocab_size = f.get_int(a + ".vocab_size").value_or(int64_t(embd->ne[1]));
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.validate();
  return c;
}

ModelWeights weights_from_gguf(const GgufFile& f, const ModelConfig& c, ThreadPool& pool) {
  ModelWeights w;
  w.embed = read_matrix(f, "token_embd.weight", c.vocab_size, c.hidden_size, pool);
  w.final_norm = read_matrix(f, "output_norm.weight", 1, c.hidden_size, pool);
  if (!c.tied_embeddings) w.lm_head = read_matrix(f, "output.weight", c.vocab_size, c.hidden_size, pool);
  // Grow one layer at a time: block_count comes from metadata (up to 2^31), and a file that
  // claims more layers than it has tensors must fail at the first missing one, not first
  // allocate empty storage for every claimed layer.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers.emplace_back();
    for (const LayerTensor& t : kLayerTensors)
      if (t.in(c)) L.*t.field = read_matrix(f, fmt::format("blk.{}.{}", l, t.gguf), t.n_rows(c), t.n_cols(c), pool);
  }
  return w;
}

}  // namespace kiln::gguf
