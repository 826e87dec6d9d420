// A Hugging Face model directory's config.json (and generation_config.json) as kiln's typed
// ModelConfig. Supported: LlamaForCausalLM (SmolLM2 is one), MistralForCausalLM and
// Qwen2ForCausalLM (q/k/v biases). Any other architecture, activation, bias layout or RoPE
// scaling kind is refused by name rather than run wrong.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace kiln::hf {

// config.json -> ModelConfig (validated). Throws kiln::Error: unsupported for an architecture or
// feature kiln does not run, invalid_model for missing or mistyped fields.
ModelConfig config_from_hf_json(const nlohmann::json& config);

// The end-of-sequence ids a config declares in "eos_token_id" (an int, a list of ints, or
// absent/null -> empty). Each must be in [0, vocab_size).
std::vector<int32_t> eos_ids_from_json(const nlohmann::json& config, int64_t vocab_size, const char* what);

}  // namespace kiln::hf
