// End-to-end tuning of the int4 group grids against the unquantized model's next-token
// distributions (`kiln quantize --tune-epochs N`; session 22, in the manner of EfficientQAT's E2E-QP:
// Chen et al., 2024, and the continuous half of PV-Tuning: Malinovskii et al., 2024).
//
// Every step before it (AWQ's scales, GPTQ, the refit and the descent) fits one matrix at a time to
// its own outputs; the errors they leave add up through 30 layers, and what the model is judged by is
// its distribution over the next token. Here the codes are held and every int4 group's scale and min
// (two numbers per 64 or 128 weights) move together to lower the mean KL divergence of the quantized
// model's next-token distribution from the teacher's (the model before quantization) on the
// calibration windows, by Adam on the gradient model_gradient.h computes. Parameters: s = s0 exp(a) and
// m = m0 + s0 b per group, so that a step of the learning rate moves every scale by about that share
// and every min by about that share of a grid step, whatever the matrix's magnitude. The format, the
// codes and the kernels are unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace kiln::quant {

struct GridTuneOptions {
  int epochs = 1;       // passes over the calibration windows, one Adam step a window
  double lr = 3e-4;     // Adam's first step (in a and b above); it decays to 0 on a half cosine
  int64_t window = 512; // tokens a window (positions 0 .. window-1, as the calibration passes)
  // One gain a row (output channel) instead of each group's scale and min: 1/(2 * groups) as many
  // numbers to learn from the same tokens.
  bool per_row = false;
};

struct GridTuneReport {
  int epoch = 0;
  int64_t window = 0, windows = 0;
  double kl = 0;  // mean KL per token on this window before its step (in-sample)
  double seconds = 0;
};

// The bytes tune_int4_grids holds beyond the two models: the teacher's log-probabilities of every
// calibration token (float), one window's activations and its logits and their gradient.
double grid_tuning_bytes(const ModelConfig& config, int64_t tokens, int64_t window);

// Tunes the grids of every int4 matrix of `student`'s layers (others are left alone) as above, on the
// whole windows of `tokens`. `teacher` has the same shapes, unquantized.
void tune_int4_grids(const ModelConfig& config, const ModelWeights& teacher, ModelWeights& student, ThreadPool& pool,
                     std::span<const int32_t> tokens, const GridTuneOptions& options,
                     const std::function<void(const GridTuneReport&)>& report);

}  // namespace kiln::quant
