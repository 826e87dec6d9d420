// A stand-in for the model in scheduler tests: its "next token" is a hash of every previous token
// of the request mod the vocabulary, but it reads those tokens back through the step's block tables
// from a paged cache it writes itself. A wrong block table, a block shared by two live requests, a
// stale block, or a skipped recompute after preemption either fails a check here or changes the
// tokens, which the tests compare with the same request generated alone.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/step_plan.h"

namespace kiln::test {

inline int32_t hash_next_token(std::span<const int32_t> tokens, int32_t vocab) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, with a final mix
  for (int32_t t : tokens) {
    h ^= uint32_t(t);
    h *= 1099511628211ull;
  }
  h ^= h >> 29;
  return int32_t(h % uint64_t(vocab));
}

struct AloneResult {
  std::vector<int32_t> output;
  FinishReason reason = FinishReason::length;
};

// The request run by itself, one token at a time, with no cache: the reference.
inline AloneResult generate_alone(std::vector<int32_t> tokens, int64_t max_new_tokens, int32_t vocab, int32_t eos) {
  AloneResult result;
  while (int64_t(result.output.size()) < max_new_tokens) {
    int32_t next = hash_next_token(tokens, vocab);
    tokens.push_back(next);
    result.output.push_back(next);
    if (next == eos) {
      result.reason = FinishReason::stop;
      break;
    }
  }
  return result;
}

class FakePagedModel {
 public:
  FakePagedModel(int32_t num_blocks, int32_t block_size, int32_t vocab, int32_t eos)
      : block_size_(block_size), vocab_(vocab), eos_(eos), slots_(size_t(num_blocks) * size_t(block_size)) {}

  // Writes every chunk's tokens into the cache (as a forward writes K/V), then, for each chunk that
  // needs logits, reads the whole sequence back through its block table and samples.
  std::vector<SampledToken> forward(const StepPlan& plan) {
    for (const auto& chunk : plan.chunks) {
      if (chunk.first_position == 0) ++incarnation_[chunk.id];  // a fresh start or a recompute
      for (size_t i = 0; i < chunk.tokens.size(); ++i) {
        int64_t position = chunk.first_position + int64_t(i);
        Slot* slot = slot_of(chunk, position);
        if (!slot) return {};
        *slot = {chunk.id, incarnation_[chunk.id], position, chunk.tokens[i]};
      }
    }
    std::vector<SampledToken> sampled;
    for (const auto& chunk : plan.chunks) {
      if (!chunk.needs_logits) continue;
      std::vector<int32_t> history;
      int64_t end = chunk.first_position + int64_t(chunk.tokens.size());
      for (int64_t position = 0; position < end; ++position) {
        const Slot* slot = slot_of(chunk, position);
        if (!slot) return {};
        if (slot->owner != chunk.id || slot->incarnation != incarnation_[chunk.id] || slot->position != position) {
          ADD_FAILURE() << "request " << chunk.id << " reads a slot at position " << position << " written by request "
                        << slot->owner << " (incarnation " << slot->incarnation << ", position " << slot->position
                        << ")";
          return {};
        }
        history.push_back(slot->token);
      }
      int32_t next = hash_next_token(history, vocab_);
      sampled.push_back({chunk.id, next, next == eos_});
    }
    return sampled;
  }

 private:
  struct Slot {
    int64_t owner = -1;
    int64_t incarnation = -1;
    int64_t position = -1;
    int32_t token = -1;
  };

  Slot* slot_of(const ScheduledChunk& chunk, int64_t position) {
    size_t index = size_t(position / block_size_);
    if (index >= chunk.block_table.size()) {
      ADD_FAILURE() << "request " << chunk.id << ": position " << position << " is past its "
                    << chunk.block_table.size() << " blocks";
      return nullptr;
    }
    size_t slot = size_t(chunk.block_table[index]) * size_t(block_size_) + size_t(position % block_size_);
    if (slot >= slots_.size()) {
      ADD_FAILURE() << "request " << chunk.id << ": block id " << chunk.block_table[index] << " out of range";
      return nullptr;
    }
    return &slots_[slot];
  }

  int32_t block_size_;
  int32_t vocab_;
  int32_t eos_;
  std::vector<Slot> slots_;
  std::unordered_map<RequestId, int64_t> incarnation_;
};

}  // namespace kiln::test
