// The small Llama-shaped config the GPU tests build their variants from (3 layers, hidden 256,
// GQA 4 with head_dim 64, half RoPE, vocabulary 500): big enough to exercise every kernel path,
// small enough that the CPU reference runs in milliseconds.
#pragma once

#include "model/config.h"

namespace kiln::gputest {

inline ModelConfig small_llama() {
  ModelConfig c;
  c.architecture = "llama";
  c.name = "test-llama";
  c.vocab_size = 500;
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 1;
  c.head_dim = 64;
  c.context_length = 512;
  c.rope.theta = 10000.0f;
  c.rope.rot_dim = 64;
  c.rope.style = RopeStyle::half;
  return c;
}

}  // namespace kiln::gputest
