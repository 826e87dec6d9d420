// The CPU reference backend: the whole Llama-family forward pass over fp32 weights, built from
// the operators in ops.h. Readable first; it is the oracle for the GPU.
//
// One code path serves both entry points: the KV cache is always a pool of blocks addressed
// through block tables, and a single sequence's private cache (new_sequence) is a pool of one
// block as long as its capacity.
#pragma once

#include <functional>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/weights.h"

namespace kiln {

class CpuKvPool;

// The input of a layer's matrix products, as calibration (src/quant) sees it.
enum class LinearSite : uint8_t {
  attn_in,   // normalized x, the input of q, k and v
  attn_out,  // the attention output, the input of o
  mlp_in,    // normalized x, the input of gate and up
  mlp_act,   // silu(gate) * up, the input of down
};
// Called with every row of a site's input (rows x cols, row-major) in each forward. An observer
// may scale x's columns in place, together with the weights that produce them (quant/gain_fit.h):
// the forward goes on with x as the observer leaves it.
using ActivationObserver =
    std::function<void(int64_t layer, LinearSite site, float* x, int64_t rows, int64_t cols)>;

class CpuBackend final : public Backend {
 public:
  CpuBackend(ModelConfig config, ModelWeights weights, ThreadPool& pool);

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // For an activation observer that quantizes as the forward goes (quant/gptq.h's sequential GPTQ):
  // a matrix changed in the observer is what the forward multiplies by from then on.
  ModelWeights& mutable_weights() { return weights_; }
  std::unique_ptr<KvSequence> new_sequence(int64_t capacity) override;
  int64_t kv_bytes_per_element() const override { return 4; }
  std::unique_ptr<KvPool> new_kv_pool(int32_t num_blocks, int32_t block_size) override;
  // Sees the input of every matrix product (calibration); an empty function turns it off.
  void set_activation_observer(ActivationObserver observer) { observer_ = std::move(observer); }

 private:
  void forward_impl(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits,
                    std::vector<float>& logits) override;
  void forward_batch_impl(KvPool& pool, std::span<const BatchEntry> entries, std::vector<float>& logits,
                          std::vector<int32_t>* argmax) override;
  // The layers over every entry's tokens; logits for the last token of each entry with
  // want_logits, or for every token when all_positions (single-sequence forward with all_logits).
  void run(CpuKvPool& pool, std::span<const BatchEntry> entries, bool all_positions, std::vector<float>& logits);
  // y = x * w^T (+ bias) as the GPU computes it for w's format: an fp8 (W8A8) matrix first
  // fake-quantizes each row of x to fp8 with its own scale (amax / 448); others use x as is (the
  // dequantized weights are already in w.data).
  void linear(const float* x, const HostMatrix& w, const float* bias, float* y, int64_t rows);
  // Rounds or quantize-dequantizes new K/V rows (rows x kv_dim) as the KV cache format stores them.
  void store_format(float* kv, int64_t rows) const;
  bool supports_kv_cache_format(KvCacheFormat) const override { return true; }

  ModelConfig config_;
  ModelWeights weights_;
  ThreadPool& pool_;
  ActivationObserver observer_;
  std::vector<float> act_scratch_;  // fake-quantized activations of fp8 products
};

}  // namespace kiln
