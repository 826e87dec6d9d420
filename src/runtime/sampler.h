// Picks the next token from a row of logits: penalties, then temperature, then the top-k /
// top-p / min-p filters (the order Hugging Face's and vLLM's samplers use), then a draw from a
// seeded generator. Same seed and same logits, same token.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/sampling.h"

namespace kiln {

// Whether params apply any penalty (repetition, presence or frequency).
bool has_penalties(const SamplingParams& params);

// The tokens the penalties act on: each id of the last penalty_last_n tokens of history (all of it
// when <= 0) with its count, into `counts` (cleared first). Shared by Sampler and the GPU
// backend's device sampler, which applies the same formulas on the device.
void penalty_window(const SamplingParams& params, std::span<const int32_t> history,
                    std::unordered_map<int32_t, int32_t>& counts);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // logits is modified (penalties, scaling). history: the sequence so far (prompt + output).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

  static int32_t argmax(std::span<const float> logits);

 private:
  void apply_penalties(std::span<float> logits, std::span<const int32_t> history);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> counts_;  // the penalty window, reused between calls
  std::vector<std::pair<float, int32_t>> candidates_;  // reused between calls
};

}  // namespace kiln
