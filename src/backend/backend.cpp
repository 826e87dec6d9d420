#include "backend/backend.h"

#include "core/check.h"

namespace kiln {

void KvSequence::truncate(int64_t n) {
  KILN_CHECK(n >= 0 && n <= n_past_, invalid_argument, "cannot truncate a sequence of {} tokens to {}", n_past_, n);
  n_past_ = n;
}

void Backend::forward(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits) {
  const int64_t n = int64_t(tokens.size()), vocab = config().vocab_size;
  KILN_CHECK(n > 0, invalid_argument, "forward needs at least one token");
  KILN_CHECK(seq.n_past() + n <= seq.capacity(), invalid_argument,
             "{} cached + {} new tokens exceed the sequence's KV capacity of {}", seq.n_past(), n, seq.capacity());
  for (int32_t t : tokens)
    KILN_CHECK(t >= 0 && t < vocab, invalid_argument, "token id {} is outside the vocabulary [0, {})", t, vocab);
  forward_impl(seq, tokens, all_logits, logits);
}

}  // namespace kiln
