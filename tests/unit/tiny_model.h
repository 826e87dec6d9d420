// A tiny random Llama-shaped model on the CPU backend, for tests of batching and the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "model/random_weights.h"

namespace kiln::test {

inline ModelConfig tiny_config() {
  ModelConfig c;
  c.architecture = "llama";
  c.name = "tiny";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 160;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.context_length = 1024;
  c.rope.theta = 10000.0f;
  c.rope.rot_dim = 16;
  c.rope.style = RopeStyle::half;
  return c;
}

// 128 tokens of the tiny vocabulary, for the calibration passes (src/quant) in windows of 32.
inline std::vector<int32_t> calibration_tokens() {
  std::vector<int32_t> tokens(128);
  for (int i = 0; i < 128; ++i) tokens[size_t(i)] = (i * 29 + 3) % 97;
  return tokens;
}

// scale 0.5 makes the logits spread enough that greedy decoding does not loop on one token.
inline std::unique_ptr<CpuBackend> tiny_backend(ThreadPool& pool, uint64_t seed = 7) {
  const ModelConfig c = tiny_config();
  return std::make_unique<CpuBackend>(c, random_weights(c, seed, 0.5f), pool);
}

}  // namespace kiln::test
