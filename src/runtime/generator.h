// Single-sequence generation: prefill the prompt, then sample and decode one token at a time,
// handing each token to a callback. Used by `kiln run`; the batching engine supersedes it for
// serving.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kiln/sampling.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct GenerateOptions {
  int32_t max_new_tokens = 128;
  SamplingParams sampling;
  bool ignore_eos = false;
  int32_t prefill_chunk = 512;  // prompt tokens per forward call
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (without the prompt)
  double prompt_seconds = 0;
  double generate_seconds = 0;  // from the first sampled token to the last
  bool stopped_by_eos = false;
};

// on_token returns false to stop early. Throws kiln::Error when the prompt does not fit.
GenerateResult generate(Backend& backend, KvSequence& seq, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const std::function<bool(int32_t)>& on_token);

}  // namespace kiln
