// How the next token is chosen. Field names and meanings follow the OpenAI API / vLLM; the CLI
// maps llama.cpp's flags onto them.
#pragma once

#include <cstdint>

namespace kiln {

struct SamplingParams {
  float temperature = 0.8f;         // <= 0: greedy (argmax)
  int32_t top_k = 40;               // <= 0: off
  float top_p = 0.95f;              // 1: off
  float min_p = 0.05f;              // 0: off; keep tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1: off; HF/llama.cpp style, over the last penalty_last_n tokens
  float presence_penalty = 0.0f;    // OpenAI style: subtract once if the token appeared
  float frequency_penalty = 0.0f;   // OpenAI style: subtract per appearance
  int32_t penalty_last_n = 64;      // window for the penalties; <= 0: the whole history
  uint64_t seed = 0;

  // Throws kiln::Error(invalid_argument) naming the first out-of-range field.
  void validate() const;
};

}  // namespace kiln
