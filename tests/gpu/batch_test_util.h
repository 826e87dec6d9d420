// Helpers of the forward_batch GPU tests (batch_backend_test.cpp, batch_fused_epilogue_test.cpp,
// kv_quant_backend_test.cpp): two small model shapes, prompts, a tiny block manager that scatters
// block tables, and the entries of a step.
#pragma once

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "backend/backend.h"
#include "gpu_test_models.h"

namespace kiln::gputest {

inline ModelConfig batch_llama() {  // GQA 4, head_dim 64, half RoPE
  ModelConfig c = small_llama();
  c.name = "batch-llama";
  c.context_length = 1024;
  return c;
}

inline ModelConfig batch_d128_bias() {  // GQA 2, head_dim 128, qkv bias, interleaved RoPE, tied embeddings
  ModelConfig c = batch_llama();
  c.name = "batch-d128-bias";
  c.vocab_size = 777;
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 128;
  c.rope.rot_dim = 128;
  c.rope.style = RopeStyle::interleaved;
  c.qkv_bias = true;
  c.tied_embeddings = true;
  return c;
}

inline std::vector<int32_t> prompt(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 131 + salt * 29 + 7) % vocab);
  return t;
}

inline int32_t argmax(std::span<const float> v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }
inline float top2_gap(std::span<const float> v) {
  std::vector<float> s(v.begin(), v.end());
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<>());
  return s[0] - s[1];
}
inline std::span<const float> row(const std::vector<float>& l, size_t i, int64_t vocab) {
  return std::span<const float>(l).subspan(i * size_t(vocab), size_t(vocab));
}

// A tiny block manager: blocks handed out from a shuffled free list, so tables are scattered.
struct Blocks {
  int32_t bs;
  std::vector<int32_t> free;
  std::vector<std::vector<int32_t>> tables;  // per sequence
  Blocks(int32_t num_blocks, int32_t block_size, size_t n_seq, uint32_t seed) : bs(block_size), tables(n_seq) {
    free.resize(size_t(num_blocks));
    std::iota(free.begin(), free.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(free.begin(), free.end(), rng);
  }
  // Grows sequence s's table to cover positions 0 .. end - 1.
  const std::vector<int32_t>& cover(size_t s, int64_t end) {
    while (int64_t(tables[s].size()) * bs < end) {
      if (free.empty()) throw std::runtime_error("test pool too small");
      tables[s].push_back(free.back());
      free.pop_back();
    }
    return tables[s];
  }
};

// One entry of a step: sequence s runs `tokens` at `first`.
struct Step {
  size_t s;
  std::vector<int32_t> tokens;
  int64_t first;
  bool want;
};
inline std::vector<BatchEntry> entries_of(const std::vector<Step>& steps, Blocks& blocks) {
  std::vector<BatchEntry> out;
  for (const Step& st : steps) {
    BatchEntry e;
    e.tokens = st.tokens;
    e.first_position = st.first;
    e.block_table = blocks.cover(st.s, st.first + int64_t(st.tokens.size()));
    e.want_logits = st.want;
    out.push_back(e);
  }
  return out;
}

}  // namespace kiln::gputest
