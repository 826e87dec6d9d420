#include "runtime/generator.h"

#include <chrono>
#include <cmath>

#include "core/check.h"
#include "runtime/sampler.h"

namespace kiln {

GenerateResult generate(Backend& backend, KvSequence& seq, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const std::function<bool(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  KILN_CHECK(!prompt.empty(), invalid_argument, "the prompt is empty");
  KILN_CHECK(options.max_new_tokens >= 0, invalid_argument, "max_new_tokens must be >= 0");
  KILN_CHECK(int64_t(prompt.size()) <= seq.capacity() - seq.n_past(), invalid_argument,
             "the prompt has {} tokens but the context holds {} (raise -c/--ctx-size)", prompt.size(),
             seq.capacity() - seq.n_past());
  Sampler sampler(options.sampling);
  GenerateResult result;
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  // The last token's logits, in the backend's own buffer (Backend::forward_last): valid until the next
  // step, which comes only after the sampler has read them.
  std::span<float> logits;

  auto t0 = clock::now();
  for (size_t pos = 0; pos < prompt.size(); pos += size_t(options.prefill_chunk)) {
    size_t n = std::min(prompt.size() - pos, size_t(options.prefill_chunk));
    logits = backend.forward_last(seq, prompt.subspan(pos, n));
  }
  auto t1 = clock::now();
  result.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  // Embedding rows past the tokenizer's vocabulary are padding: never sample them (they have no text).
  const size_t n_text_tokens = size_t(tokenizer.vocab_size());
  for (int32_t i = 0; i < options.max_new_tokens; ++i) {
    for (size_t v = n_text_tokens; v < logits.size(); ++v) logits[v] = -INFINITY;
    int32_t token = sampler.sample(logits, history);
    result.tokens.push_back(token);
    history.push_back(token);
    if (!options.ignore_eos && tokenizer.is_end_of_generation(token)) {
      result.stopped_by_eos = true;
      break;
    }
    if (!on_token(token)) break;
    if (i + 1 == options.max_new_tokens || seq.n_past() >= seq.capacity()) break;
    logits = backend.forward_last(seq, std::span<const int32_t>(&token, 1));
  }
  result.generate_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return result;
}

}  // namespace kiln
