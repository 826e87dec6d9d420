// A tiny random Llama-shaped model on the CPU backend, for tests of batching and the engine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
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

// Every position's logits of `tokens` run as one sequence through the CPU reference.
inline std::vector<float> all_logits(CpuBackend& b, std::span<const int32_t> tokens) {
  auto seq = b.new_sequence(int64_t(tokens.size()));
  std::vector<float> logits;
  b.forward(*seq, tokens, true, logits);
  return logits;
}
inline std::vector<float> all_logits(const ModelConfig& c, const ModelWeights& w, ThreadPool& pool,
                                     std::span<const int32_t> tokens) {
  CpuBackend b(c, w, pool);
  return all_logits(b, tokens);
}

inline double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, double(std::fabs(v)));
  return m;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

}  // namespace kiln::test
