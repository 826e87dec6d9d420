// The interface every compute backend implements: run a chunk of tokens of one sequence through
// the model, append their keys/values to that sequence's cache, and return logits.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"

namespace kiln {

// A sequence's KV cache on some backend. n_past tokens are cached; capacity is the most it holds.
class KvSequence {
 public:
  virtual ~KvSequence() = default;
  int64_t n_past() const { return n_past_; }
  int64_t capacity() const { return capacity_; }
  // Forgets cached tokens past n (n <= n_past): a rollback, or a reset with n = 0.
  void truncate(int64_t n);

 protected:
  explicit KvSequence(int64_t capacity) : capacity_(capacity) {}
  int64_t n_past_ = 0;
  int64_t capacity_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual std::unique_ptr<KvSequence> new_sequence(int64_t capacity) = 0;
  // Runs tokens at positions seq.n_past() ... and advances n_past. logits gets vocab_size floats
  // per token when all_logits, else for the last token only. Checks the request (at least one
  // token, within the sequence's capacity, ids inside the vocabulary) for every backend alike,
  // then runs forward_impl.
  void forward(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits);

 protected:
  virtual void forward_impl(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits,
                            std::vector<float>& logits) = 0;
};

}  // namespace kiln
