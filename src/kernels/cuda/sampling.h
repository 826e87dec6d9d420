// Token selection on the GPU, one block per row of logits (rows, vocab) fp32.
//   argmax: greedy; ties go to the lowest id (as std::max_element).
//   sample_rows: the whole of runtime/sampler.h's pipeline with each row's own parameters --
//   penalties, temperature, top-k, top-p, min-p -- so that a batched step sends back one id a row
//   instead of 128k logits. What is exact and what is not (vs the CPU sampler):
//     * top_k <= 0 (or >= vocab) and top_p = 1: exact over the whole vocabulary, by the Gumbel-max
//       trick (argmax of z_i + g_i, z = (logit - max) / T, g_i Gumbel noise from a hash of
//       (seed, counter, i)); min_p is the floor z_i >= log(min_p).
//     * 1 <= top_k <= kSampleMaxK: exact (radix select of the top k, ties to the lower id; top-p and
//       min-p over the sorted candidates, as the CPU does; one uniform draw u(seed, counter)).
//     * top_k <= 0 with top_p < 1: the candidates are the top kSampleMaxK and the top-p mass is
//       counted against the whole vocabulary's softmax, so the cut is exact whenever the nucleus
//       has at most kSampleMaxK tokens (real models at top_p <= 0.95); a larger nucleus samples
//       from the whole distribution (above the min-p floor) instead.
//     * kSampleMaxK < top_k < vocab: treated as kSampleMaxK.
//   The draw is a function of (seed, counter): the same request replays the same tokens on the
//   GPU, but not the CPU sampler's (which draws from std::mt19937_64).
#pragma once

#include "kernels/cuda/common.h"
#include "model/random_weights.h"

namespace kiln::cuda {

constexpr int kSampleMaxK = 1024;

// Scratch for argmax over a few rows: each row is split over several blocks (one 1024-thread block
// walks a 128k row in ~19 us, one load after another: a batch-1 step's last kernel), and the
// block of a row that finishes last reduces the partials. `tickets` (argmax_split_rows of them)
// must be zero when first used; every call leaves them zero.
struct ArgmaxWorkspace {
  float* values = nullptr;  // (argmax_split_rows, kArgmaxMaxSplits)
  int32_t* ids = nullptr;   // the same
  uint32_t* tickets = nullptr;
};
constexpr int kArgmaxMaxSplits = 64;
// Rows up to which argmax splits them (beyond, a block per row fills the GPU on its own).
constexpr int64_t kArgmaxSplitRows = 32;

// Greedy ids of `rows` rows; `ws` (optional: without it a block per row) for rows <= kArgmaxSplitRows.
void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t stream,
            ArgmaxWorkspace ws = {});

// Greedy ids from per-tile partials: out[r] = the best of the `per_row` (value, id) pairs of row r
// (parts (rows, per_row), the id's bits in .y), in argmax's order; 0 where every value is NaN. The
// second half of matmul.h's gemm_argmax.
void argmax_parts(const float2* parts, int64_t rows, int per_row, int32_t* out, cudaStream_t stream);

// One row's draw. Penalties (runtime/sampler.cpp's formulas) apply to the ids in
// pen_ids[pen_begin, pen_end) with their counts in the history window.
struct RowSampling {
  float temperature = 1.0f;  // <= 0: argmax after the penalties
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t pen_begin = 0, pen_end = 0;
  uint64_t seed = 0;
  uint64_t counter = 0;  // e.g. the number of tokens the request has generated
};
// logits is modified in place (the penalties). params, pen_ids, pen_counts in device memory.
void sample_rows(float* logits, int64_t rows, int64_t vocab, const RowSampling* params, const int32_t* pen_ids,
                 const int32_t* pen_counts, int32_t* out, cudaStream_t stream);

// The uniform draw in [0, 1) of draw `counter`, shared with host-side references.
KILN_HD float sample_uniform(uint64_t seed, uint64_t counter) {
  return 0.5f * (kiln::random_uniform(seed, 0x5a3b1e, counter) + 1.0f);
}
// Gumbel noise of token i in draw `counter`: -log(-log(u)), u in (0, 1) from 24 hashed bits.
KILN_HD float sample_gumbel(uint64_t seed, uint64_t counter, int64_t i) {
  const uint64_t h = kiln::splitmix64(kiln::splitmix64(seed ^ (counter * 0x9e3779b97f4a7c15ull)) + uint64_t(i));
  const float u = (float(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(-logf(u));
}

}  // namespace kiln::cuda
