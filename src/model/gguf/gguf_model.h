// A Llama-family model from a GGUF file: its config from metadata and its weights, converted
// to fp32 with every tensor's shape checked against the config.
#pragma once

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/gguf/gguf_file.h"
#include "model/weights.h"

namespace kiln::gguf {

ModelConfig config_from_gguf(const GgufFile& file);
ModelWeights weights_from_gguf(const GgufFile& file, const ModelConfig& config, ThreadPool& pool);

}  // namespace kiln::gguf
