#include "model/hf/hf_config.h"

#include <limits>
#include <string>

#include "core/check.h"

namespace kiln::hf {
namespace {

using nlohmann::json;

// A field that is absent or null counts as absent (HF writes "head_dim": null, "rope_scaling": null).
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t get_int(const json& j, const char* key, std::optional<int64_t> fallback = std::nullopt) {
  const json* v = field(j, key);
  if (!v) {
    KILN_CHECK(fallback.has_value(), invalid_model, "config.json lacks '{}'", key);
    return *fallback;
  }
  KILN_CHECK(v->is_number_integer(), invalid_model, "config.json '{}' is {}, not an integer", key, v->dump());
  return v->get<int64_t>();
}

double get_float(const json& j, const char* key, double fallback, const char* where = "config.json") {
  const json* v = field(j, key);
  if (!v) return fallback;
  KILN_CHECK(v->is_number(), invalid_model, "{} '{}' is {}, not a number", where, key, v->dump());
  return v->get<double>();
}

bool get_bool(const json& j, const char* key, bool fallback) {
  const json* v = field(j, key);
  if (!v) return fallback;
  KILN_CHECK(v->is_boolean(), invalid_model, "config.json '{}' is {}, not true/false", key, v->dump());
  return v->get<bool>();
}

// rope_scaling (transformers <= 4.x) or rope_parameters (5.x, which also carries rope_theta).
void read_rope(const json& j, ModelConfig& c) {
  const json* params = field(j, "rope_parameters");
  const json* scaling = params ? params : field(j, "rope_scaling");
  double theta = get_float(j, "rope_theta", 10000.0);
  if (params) {
    KILN_CHECK(params->is_object(), invalid_model, "config.json 'rope_parameters' is {}, not an object",
               params->dump());
    theta = get_float(*params, "rope_theta", theta, "config.json rope_parameters");
  }
  c.rope.theta = float(theta);
  if (!scaling) return;
  const char* where = params ? "rope_parameters" : "rope_scaling";
  KILN_CHECK(scaling->is_object(), invalid_model, "config.json '{}' is {}, not an object", where, scaling->dump());
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (const json* t = field(*scaling, key)) {
      KILN_CHECK(t->is_string(), invalid_model, "config.json {}.{} is {}, not a string", where, key, t->dump());
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default") return;
  KILN_CHECK(type == "llama3", unsupported,
             "config.json {}: rope type '{}' is not supported (kiln runs default and llama3 RoPE)", where, type);
  auto f = [&](const char* key) {
    KILN_CHECK(field(*scaling, key), invalid_model, "config.json {} (llama3) lacks '{}'", where, key);
    return get_float(*scaling, key, 0, "config.json rope scaling");
  };
  c.rope.llama3_factor = float(f("factor"));
  c.rope.llama3_low_freq_factor = float(f("low_freq_factor"));
  c.rope.llama3_high_freq_factor = float(f("high_freq_factor"));
  double orig = f("original_max_position_embeddings");
  KILN_CHECK(orig >= 1 && orig <= std::numeric_limits<int>::max() && orig == double(int64_t(orig)), invalid_model,
             "config.json {}: original_max_position_embeddings {} is not a positive integer", where, orig);
  c.rope.llama3_original_context = int(orig);
  KILN_CHECK(c.rope.llama3_factor >= 1 && c.rope.llama3_low_freq_factor > 0 &&
                 c.rope.llama3_high_freq_factor > c.rope.llama3_low_freq_factor,
             invalid_model, "config.json {}: llama3 factors (factor {}, low {}, high {}) are out of range", where,
             c.rope.llama3_factor, c.rope.llama3_low_freq_factor, c.rope.llama3_high_freq_factor);
}

}  // namespace

ModelConfig config_from_hf_json(const json& j) {
  KILN_CHECK(j.is_object(), invalid_model, "config.json is a JSON {}, not an object", j.type_name());
  const json* archs = field(j, "architectures");
  KILN_CHECK(archs && archs->is_array() && archs->size() == 1 && (*archs)[0].is_string(), invalid_model,
             "config.json needs 'architectures' with one name, e.g. [\"LlamaForCausalLM\"]");
  const std::string arch = (*archs)[0].get<std::string>();
  ModelConfig c;
  if (arch == "LlamaForCausalLM") {
    c.architecture = "llama";
  } else if (arch == "MistralForCausalLM") {
    c.architecture = "mistral";
  } else if (arch == "Qwen2ForCausalLM") {
    c.architecture = "qwen2";
    c.qkv_bias = true;
  } else {
    KILN_FAIL(unsupported,
              "architecture '{}' is not supported; kiln runs LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM",
              arch);
  }
  if (const json* name = field(j, "_name_or_path"); name && name->is_string()) c.name = name->get<std::string>();

  if (const json* act = field(j, "hidden_act")) {
    KILN_CHECK(act->is_string() && act->get<std::string>() == "silu", unsupported,
               "config.json hidden_act {} is not supported (kiln's MLP is SwiGLU with silu)", act->dump());
  }
  KILN_CHECK(!get_bool(j, "attention_bias", false) || c.architecture == "qwen2", unsupported,
             "config.json attention_bias: true (biases on q/k/v/o) is not supported for {}", arch);
  KILN_CHECK(!get_bool(j, "mlp_bias", false), unsupported, "config.json mlp_bias: true is not supported");
  KILN_CHECK(!get_bool(j, "use_sliding_window", false), unsupported,
             "config.json use_sliding_window: true is not supported (kiln attends to the whole context)");
  if (const json* prf = field(j, "partial_rotary_factor"))
    KILN_CHECK(prf->is_number() && prf->get<double>() == 1.0, unsupported,
               "config.json partial_rotary_factor {} is not supported (kiln rotates the whole head)", prf->dump());

  c.vocab_size = get_int(j, "vocab_size");
  c.hidden_size = get_int(j, "hidden_size");
  c.intermediate_size = get_int(j, "intermediate_size");
  c.n_layers = get_int(j, "num_hidden_layers");
  c.n_heads = get_int(j, "num_attention_heads");
  c.n_kv_heads = get_int(j, "num_key_value_heads", c.n_heads);
  KILN_CHECK(c.n_heads > 0, invalid_model, "config.json num_attention_heads is {}", c.n_heads);
  c.head_dim = get_int(j, "head_dim", c.hidden_size / c.n_heads);
  c.context_length = get_int(j, "max_position_embeddings");
  // Mistral v0.1 attends within a sliding window; up to the window that is full attention, so
  // kiln caps the context there instead of computing something else beyond it.
  if (c.architecture == "mistral") {
    if (const json* sw = field(j, "sliding_window")) {
      KILN_CHECK(sw->is_number_integer() && sw->get<int64_t>() > 0, invalid_model,
                 "config.json sliding_window is {}, not a positive integer", sw->dump());
      c.context_length = std::min(c.context_length, sw->get<int64_t>());
    }
  }
  c.rms_eps = float(get_float(j, "rms_norm_eps", 1e-6));
  c.tied_embeddings = get_bool(j, "tie_word_embeddings", false);
  c.rope.style = RopeStyle::half;  // HF checkpoints rotate (i, i + d/2)
  KILN_CHECK(c.head_dim > 0 && c.head_dim <= std::numeric_limits<int>::max(), invalid_model,
             "config.json head_dim is {}", c.head_dim);
  c.rope.rot_dim = int(c.head_dim);
  read_rope(j, c);
  c.validate();
  return c;
}

std::vector<int32_t> eos_ids_from_json(const json& j, int64_t vocab_size, const char* what) {
  std::vector<int32_t> ids;
  if (!j.is_object()) return ids;
  const json* e = field(j, "eos_token_id");
  if (!e) return ids;
  auto add = [&](const json& v) {
    KILN_CHECK(v.is_number_integer(), invalid_model, "{} eos_token_id entry {} is not an integer", what, v.dump());
    int64_t id = v.get<int64_t>();
    KILN_CHECK(id >= 0 && id < vocab_size, invalid_model, "{} eos_token_id {} is outside the vocabulary (0..{})", what,
               id, vocab_size - 1);
    ids.push_back(int32_t(id));
  };
  if (e->is_array()) {
    for (const auto& v : *e) add(v);
  } else {
    add(*e);
  }
  return ids;
}

}  // namespace kiln::hf
