// Picks the next token from a row of logits: penalties, then temperature, then the top-k /
// top-p / min-p filters (the order Hugging Face's and vLLM's samplers use), then a draw from a
// seeded generator. Same seed and same logits, same token.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kiln/sampling.h"

namespace kiln {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // logits is modified (penalties, scaling). history: the sequence so far (prompt + output).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

  static int32_t argmax(std::span<const float> logits);

 private:
  void apply_penalties(std::span<float> logits, std::span<const int32_t> history) const;

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused between calls
};

}  // namespace kiln
