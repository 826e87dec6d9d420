// Opens a model by path: a .gguf file, or a Hugging Face directory (config.json + safetensors).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct LoadedModel {
  std::string path;
  ModelConfig config;
  ModelWeights weights;
  // nullptr for a Hugging Face directory whose tokenizer.json is absent or in a form kiln cannot
  // read (tokenizer_problem says which): callers that need text call require_tokenizer().
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_problem;
  std::string chat_template;  // Jinja source from the model; empty when it has none
  // Every id that ends generation as the model declares it: HF generation_config.json's
  // eos_token_id (int or list; else config.json's); GGUF: the tokenizer's EOS. May be empty.
  std::vector<int32_t> eos_token_ids;
};

// The model's tokenizer, or kiln::Error(unsupported) explaining that this model (an HF
// directory) has none kiln can read yet.
const Tokenizer& require_tokenizer(const LoadedModel& model);

// with_weights false reads only what text needs (config, tokenizer, chat template, EOS ids):
// `kiln tokenize` on a 16 GB model should not read 16 GB.
LoadedModel load_model(const std::string& path, ThreadPool& pool, bool with_weights = true);

}  // namespace kiln
