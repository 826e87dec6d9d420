// A Hugging Face model directory: config.json, model.safetensors (or shards listed by
// model.safetensors.index.json), generation_config.json. Weights are converted to fp32 with
// every tensor's shape checked against config.json (a mismatch names the tensor). Pickle
// checkpoints (*.bin, *.pt, *.pth, *.pkl) are never read.
#pragma once

#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/safetensors/safetensors_file.h"
#include "model/weights.h"

namespace kiln::hf {

struct HfModel {
  ModelConfig config;
  ModelWeights weights;
  std::vector<int32_t> eos_token_ids;  // generation_config.json, else config.json; may be empty
  std::string chat_template;           // chat_template.jinja or tokenizer_config.json; may be empty
};

bool looks_like_hf_dir(const std::string& dir);  // holds a config.json

// The safetensors of a directory: model.safetensors, else model.safetensors.index.json. Refuses
// a directory with only pickles, explaining why, and one with neither.
safetensors::TensorSet open_weights(const std::string& dir);

// Every tensor named and shaped as `config` implies, converted to fp32. Throws
// kiln::Error(invalid_model) naming the first missing or mis-shaped tensor.
ModelWeights weights_from_tensors(const safetensors::TensorSet& tensors, const ModelConfig& config,
                                  ThreadPool& pool);

// with_weights false: config, EOS ids and chat template only (for tokenize-only commands).
HfModel load_hf_dir(const std::string& dir, ThreadPool& pool, bool with_weights = true);

}  // namespace kiln::hf
