// The CPU reference backend: the whole Llama-family forward pass over fp32 weights, built from
// the operators in ops.h. Readable first; it is the oracle for the GPU.
//
// One code path serves both entry points: the KV cache is always a pool of blocks addressed
// through block tables, and a single sequence's private cache (new_sequence) is a pool of one
// block as long as its capacity.
#pragma once

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/weights.h"

namespace kiln {

class CpuKvPool;

class CpuBackend final : public Backend {
 public:
  CpuBackend(ModelConfig config, ModelWeights weights, ThreadPool& pool);

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return config_; }
  const ModelWeights& weights() const { return weights_; }
  std::unique_ptr<KvSequence> new_sequence(int64_t capacity) override;
  int64_t kv_bytes_per_element() const override { return 4; }
  std::unique_ptr<KvPool> new_kv_pool(int32_t num_blocks, int32_t block_size) override;

 private:
  void forward_impl(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits,
                    std::vector<float>& logits) override;
  void forward_batch_impl(KvPool& pool, std::span<const BatchEntry> entries, std::vector<float>& logits,
                          std::vector<int32_t>* argmax) override;
  // The layers over every entry's tokens; logits for the last token of each entry with
  // want_logits, or for every token when all_positions (single-sequence forward with all_logits).
  void run(CpuKvPool& pool, std::span<const BatchEntry> entries, bool all_positions, std::vector<float>& logits);

  ModelConfig config_;
  ModelWeights weights_;
  ThreadPool& pool_;
};

}  // namespace kiln
