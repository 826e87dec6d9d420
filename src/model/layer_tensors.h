// The tensors of one decoder layer in one table: where each lives in LayerWeights, the shape the
// config gives it, and its name in GGUF files (blk.N.<gguf>) and in Hugging Face checkpoints
// (model.layers.N.<hf>). The GGUF and safetensors readers and the GGUF writer's naming walk it,
// so a layer's parts, their shapes and their names are written down once.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace kiln {

// A tensor dimension as the config sets it.
enum class LayerDim { one, hidden, q, kv, inter };

struct LayerTensor {
  HostMatrix LayerWeights::*field;
  LayerDim rows, cols;
  const char* gguf;  // after "blk.N."
  const char* hf;    // after "model.layers.N."
  bool qkv_bias;     // present only in families with q/k/v biases (ModelConfig::qkv_bias)

  static int64_t extent(const ModelConfig& c, LayerDim d) {
    switch (d) {
      case LayerDim::one: return 1;
      case LayerDim::hidden: return c.hidden_size;
      case LayerDim::q: return c.q_dim();
      case LayerDim::kv: return c.kv_dim();
      case LayerDim::inter: return c.intermediate_size;
    }
    return 0;
  }
  int64_t n_rows(const ModelConfig& c) const { return extent(c, rows); }
  int64_t n_cols(const ModelConfig& c) const { return extent(c, cols); }
  bool in(const ModelConfig& c) const { return !qkv_bias || c.qkv_bias; }
};

// In the order the readers load them (the first tensor a broken file lacks is the one named).
inline constexpr LayerTensor kLayerTensors[] = {
    {&LayerWeights::attn_norm, LayerDim::one, LayerDim::hidden, "attn_norm.weight", "input_layernorm.weight", false},
    {&LayerWeights::wq, LayerDim::q, LayerDim::hidden, "attn_q.weight", "self_attn.q_proj.weight", false},
    {&LayerWeights::wk, LayerDim::kv, LayerDim::hidden, "attn_k.weight", "self_attn.k_proj.weight", false},
    {&LayerWeights::wv, LayerDim::kv, LayerDim::hidden, "attn_v.weight", "self_attn.v_proj.weight", false},
    {&LayerWeights::wo, LayerDim::hidden, LayerDim::q, "attn_output.weight", "self_attn.o_proj.weight", false},
    {&LayerWeights::bq, LayerDim::one, LayerDim::q, "attn_q.bias", "self_attn.q_proj.bias", true},
    {&LayerWeights::bk, LayerDim::one, LayerDim::kv, "attn_k.bias", "self_attn.k_proj.bias", true},
    {&LayerWeights::bv, LayerDim::one, LayerDim::kv, "attn_v.bias", "self_attn.v_proj.bias", true},
    {&LayerWeights::ffn_norm, LayerDim::one, LayerDim::hidden, "ffn_norm.weight", "post_attention_layernorm.weight",
     false},
    {&LayerWeights::w_gate, LayerDim::inter, LayerDim::hidden, "ffn_gate.weight", "mlp.gate_proj.weight", false},
    {&LayerWeights::w_up, LayerDim::inter, LayerDim::hidden, "ffn_up.weight", "mlp.up_proj.weight", false},
    {&LayerWeights::w_down, LayerDim::hidden, LayerDim::inter, "ffn_down.weight", "mlp.down_proj.weight", false},
};

}  // namespace kiln
