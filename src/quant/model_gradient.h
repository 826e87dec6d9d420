// The gradient of a loss on a model's logits with respect to its linear weights, for one window of
// tokens on the CPU: what the end-to-end tuning of int4 grids (grid_tuning.h) descends.
//
// The forward is the CPU backend's (same operators: cpu::rmsnorm, cpu::matmul, cpu::rope, the causal
// softmax attention, silu * up; the logits agree with CpuBackend's to fp32 rounding) with every
// activation the backward needs kept (about 27 MB a layer for a 512-token window of the default
// model: the attention probabilities are most of it). The backward is written out by hand, operator
// by operator, in the reverse order; the embedding and head get no gradient (they are not tuned).
// Tested against finite differences (tests/unit/model_gradient_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace kiln::quant {

// The seven linear matrices of a layer, in the order a WeightGradient names them.
enum class LayerMatrix { q, k, v, o, gate, up, down };
inline constexpr int kLayerMatrices = 7;
HostMatrix& layer_matrix(LayerWeights& l, LayerMatrix m);

// The loss: given the window's logits (tokens x vocab, row-major), returns the loss and writes its
// gradient with respect to each logit into `dlogits` (same shape).
using LogitLoss = std::function<double(const float* logits, float* dlogits, int64_t tokens, int64_t vocab)>;

// Called once per linear matrix of every layer, last layer first, with dL/dW (rows x cols, row-major;
// valid during the call only).
using WeightGradient = std::function<void(int64_t layer, LayerMatrix matrix, const float* grad)>;

// One window at positions 0 .. tokens.size()-1: forward, loss, backward. Returns the loss.
double model_gradient(const ModelConfig& config, const ModelWeights& w, ThreadPool& pool,
                      std::span<const int32_t> tokens, const LogitLoss& loss, const WeightGradient& on_gradient);

// The logits alone, through the same forward (tests compare them with CpuBackend's).
void model_logits(const ModelConfig& config, const ModelWeights& w, ThreadPool& pool,
                  std::span<const int32_t> tokens, std::vector<float>& logits);

}  // namespace kiln::quant
