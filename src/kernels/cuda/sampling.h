// Token selection on the GPU, one block per row of logits (rows, vocab) fp32.
//   argmax: greedy; ties go to the lowest id (as std::max_element).
//   sample_top_k_top_p: keeps the top_k largest logits (top_k <= 0 or > kSampleMaxK means
//   kSampleMaxK: candidates are capped at 1024, whose tail mass is negligible for real models),
//   softmax at `temperature`, keeps the smallest prefix (by probability, descending; ties by lower
//   id) whose mass reaches top_p, and draws with u = sample_uniform(seed, row).
#pragma once

#include "kernels/cuda/common.h"
#include "model/random_weights.h"

namespace kiln::cuda {

constexpr int kSampleMaxK = 1024;

void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t stream);

struct SampleParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
};
void sample_top_k_top_p(const float* logits, int64_t rows, int64_t vocab, SampleParams params, int32_t* out,
                        cudaStream_t stream);

// The uniform draw in [0, 1) of row `row`, shared with host-side references.
KILN_HD float sample_uniform(uint64_t seed, int64_t row) {
  return 0.5f * (kiln::random_uniform(seed, 0x5a3b1e, uint64_t(row)) + 1.0f);
}

}  // namespace kiln::cuda
