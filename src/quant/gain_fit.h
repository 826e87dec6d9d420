// Input-channel gains fitted to the unquantized model, after the int4 codes are set
// (`kiln quantize --gain-fit`; session 21, in the manner of Norm Tweaking: Li et al., 2023).
//
// GPTQ fits each matrix to its own outputs on the calibration inputs; errors that add up across
// layers are left for the layers after to absorb. This pass answers some of that drift with the
// few numbers a model can rescale exactly, one gain per input channel of each layer's four matrix
// inputs (LinearSite):
//
//   q/k/v, gate/up: the RMSNorm weight before them (attn_norm, ffn_norm);
//   o:              the rows of v (and v's bias; under grouped-query attention one v channel feeds
//                   several heads, so the gain is shared by them, as AWQ's scales for o are);
//   down:           the rows of up (silu(gate) * up is linear in up's output channels).
//
// A row of an int4 matrix times c is the same codes with its group scales and mins times c, so
// the codes, the format and the kernels are unchanged. Going through the quantized model in order,
// at each site the gains c minimize the output error against the unquantized model,
//
//   E(c) = sum_t sum_M |Q_M (c * x~_t) - W_M x_t|^2 + ridge * mean(diag A) * |c - 1|^2
//
// (x~ the quantized model's inputs, gains before it applied; x the unquantized model's; W_M the
// unquantized matrices reading the site, Q_M their dequantized int4 forms): a least-squares
// problem in c alone, with normal equations A c = b, A = (sum_M Q_M^T Q_M) o (X~^T X~) (o: the
// elementwise product) and b_i = sum_j (sum_M Q_M^T W_M)_ij (X~^T X)_ij. Fewer than 2k numbers a
// layer, against GPTAQ's whole-matrix target (gptq.h's asymmetric form, which overfit the
// calibration text here).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace kiln::quant {

struct GainFitReport {
  int64_t layer = 0;
  std::string site;           // "q/k/v", "o", "gate/up", "down"
  double error_before = 0;    // E at c = 1 (no ridge)
  double error_after = 0;     // E at the fitted gains (no ridge); error_before where not kept
  float min_gain = 1, max_gain = 1;
  bool kept = false;          // false: the solve failed, gave a gain <= 0, or did not lower E
};

// Fits and applies the gains to `w` (every linear matrix int4, as apply_gptq leaves them; data the
// dequantized values) against `reference` (the same model unquantized, AWQ scales included: the
// basis w's matrices are in), over every window of `tokens` in one batched forward of each.
// ridge: a share of mean(diag A), pulling every gain toward 1.
void fit_channel_gains(const ModelConfig& config, ModelWeights reference, ModelWeights& w, ThreadPool& pool,
                       std::span<const int32_t> tokens, int64_t window, double ridge,
                       const std::function<void(const GainFitReport&)>& on_site);

// What fit_channel_gains holds beyond the two models for `rows` calibration tokens (bytes, about):
// every site's unquantized inputs, and one forward's activations and K/V.
double gain_fit_bytes(const ModelConfig& config, int64_t rows);

}  // namespace kiln::quant
