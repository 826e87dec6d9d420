// The typed description of a Llama-family model, filled from GGUF metadata or config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// Which pairs of a head's dimensions RoPE rotates together.
//   interleaved: (2i, 2i+1) -- GGUF "llama" files, whose converter permuted the Q/K rows;
//   half:        (i, i + rot_dim/2) -- Hugging Face checkpoints, and GGUF qwen2 (NEOX style).
enum class RopeStyle { interleaved, half };

struct RopeConfig {
  float theta = 10000.0f;
  int rot_dim = 0;  // dimensions rotated per head (== head_dim for every family kiln supports)
  RopeStyle style = RopeStyle::half;
  // Llama 3.1 frequency scaling ("rope_type": "llama3"); factor == 0 means none.
  float llama3_factor = 0.0f;
  float llama3_low_freq_factor = 1.0f;
  float llama3_high_freq_factor = 4.0f;
  int llama3_original_context = 8192;
  // Per-pair divisors of the inverse frequencies (rot_dim / 2 of them): how llama.cpp's converter
  // stores Llama 3.1 scaling in GGUF (the rope_freqs tensor). Empty means none.
  std::vector<float> freq_factors;
};

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2", "mistral"
  std::string name;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t context_length = 0;
  float rms_eps = 1e-5f;
  RopeConfig rope;
  bool tied_embeddings = false;
  bool qkv_bias = false;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t n_params() const;
  // Checks the numbers are positive and consistent (heads divide, head_dim even...).
  void validate() const;
};

}  // namespace kiln
