// The CPU reference backend: the whole Llama-family forward pass over fp32 weights, built from
// the operators in ops.h. Readable first; it is the oracle for the GPU.
#pragma once

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/weights.h"

namespace kiln {

class CpuBackend final : public Backend {
 public:
  CpuBackend(ModelConfig config, ModelWeights weights, ThreadPool& pool);

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return config_; }
  const ModelWeights& weights() const { return weights_; }
  std::unique_ptr<KvSequence> new_sequence(int64_t capacity) override;


 private:
  void forward_impl(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits,
                    std::vector<float>& logits) override;
  ModelConfig config_;
  ModelWeights weights_;
  ThreadPool& pool_;
};

}  // namespace kiln
