// Opens a model by path: a .gguf file today (Hugging Face directories come with their own loader).
#pragma once

#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct LoadedModel {
  std::string path;
  ModelConfig config;
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string chat_template;  // Jinja source from the model; empty when it has none
};

LoadedModel load_model(const std::string& path, ThreadPool& pool);

}  // namespace kiln
