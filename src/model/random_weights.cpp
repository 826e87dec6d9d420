#include "model/random_weights.h"

#include "core/check.h"
#include "core/dtype.h"

namespace kiln {
namespace {

ModelConfig make(std::string arch, std::string name, int64_t vocab, int64_t hidden, int64_t inter, int64_t layers,
                 int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t ctx, float eps, float theta) {
  ModelConfig c;
  c.architecture = std::move(arch);
  c.name = std::move(name);
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.context_length = ctx;
  c.rms_eps = eps;
  c.rope.theta = theta;
  c.rope.rot_dim = int(head_dim);
  c.rope.style = RopeStyle::half;
  return c;
}

}  // namespace

std::vector<std::string> preset_names() { return {"llama3-8b", "llama2-7b", "qwen2.5-7b", "mistral-7b", "smollm2-135m"}; }

ModelConfig preset_config(std::string_view name) {
  if (name == "llama3-8b") return make("llama", "llama3-8b", 128256, 4096, 14336, 32, 32, 8, 128, 8192, 1e-5f, 500000.0f);
  if (name == "llama2-7b") return make("llama", "llama2-7b", 32000, 4096, 11008, 32, 32, 32, 128, 4096, 1e-5f, 10000.0f);
  if (name == "qwen2.5-7b") {
    ModelConfig c = make("qwen2", "qwen2.5-7b", 152064, 3584, 18944, 28, 28, 4, 128, 32768, 1e-6f, 1000000.0f);
    c.qkv_bias = true;
    return c;
  }
  if (name == "mistral-7b") return make("llama", "mistral-7b", 32768, 4096, 14336, 32, 32, 8, 128, 32768, 1e-5f, 1000000.0f);
  if (name == "smollm2-135m") {
    ModelConfig c = make("llama", "smollm2-135m", 49152, 576, 1536, 30, 9, 3, 64, 8192, 1e-5f, 100000.0f);
    c.tied_embeddings = true;
    return c;
  }
  KILN_FAIL(invalid_argument, "unknown model preset '{}'; known: llama3-8b, llama2-7b, qwen2.5-7b, mistral-7b, smollm2-135m",
            name);
}

ModelWeights random_weights(const ModelConfig& c, uint64_t seed, float scale) {
  c.validate();
  KILN_CHECK(c.n_params() < (int64_t(1) << 31), invalid_argument,
             "random_weights builds host weights for small configs only ({} parameters requested)", c.n_params());
  auto fill = [&](int64_t rows, int64_t cols, uint64_t stream) {
    HostMatrix m(rows, cols);
    for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = round_to_bf16(random_value(seed, stream, i, scale));
    return m;
  };
  using namespace rng_tensor;
  ModelWeights w;
  w.embed = fill(c.vocab_size, c.hidden_size, embed);
  w.final_norm = fill(1, c.hidden_size, final_norm);
  if (!c.tied_embeddings) w.lm_head = fill(c.vocab_size, c.hidden_size, lm_head);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights L;
    L.attn_norm = fill(1, c.hidden_size, layer(l, attn_norm));
    L.wq = fill(c.q_dim(), c.hidden_size, layer(l, wq));
    L.wk = fill(c.kv_dim(), c.hidden_size, layer(l, wk));
    L.wv = fill(c.kv_dim(), c.hidden_size, layer(l, wv));
    L.wo = fill(c.hidden_size, c.q_dim(), layer(l, wo));
    if (c.qkv_bias) {
      L.bq = fill(1, c.q_dim(), layer(l, bq));
      L.bk = fill(1, c.kv_dim(), layer(l, bk));
      L.bv = fill(1, c.kv_dim(), layer(l, bv));
    }
    L.ffn_norm = fill(1, c.hidden_size, layer(l, ffn_norm));
    L.w_gate = fill(c.intermediate_size, c.hidden_size, layer(l, w_gate));
    L.w_up = fill(c.intermediate_size, c.hidden_size, layer(l, w_up));
    L.w_down = fill(c.hidden_size, c.intermediate_size, layer(l, w_down));
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace kiln
