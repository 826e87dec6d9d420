// Activation-aware int4 scaling in the manner of AWQ (Lin et al., 2023, "AWQ: Activation-aware
// Weight Quantization for LLM Compression and Acceleration").
//
// For each group of matrices that read one input (a layer's q/k/v; its o; its gate/up; its down),
// input channel i gets a scale s_i = mean|x_i|^alpha: the weights' columns are multiplied by s
// before round-to-nearest int4 quantization (salient channels, those with large activations, get
// finer steps), and 1/s is folded into the operation that produces the input, so that the product
// is unchanged in exact arithmetic. alpha is grid-searched in {0, 0.05, ..., 1} per group to
// minimize || X W^T - X (Q(W diag(s)) diag(1/s))^T ||^2 over calibration rows X; alpha = 0 is plain
// round-to-nearest, so the search never does worse than it on the calibration rows.
//
// Where 1/s goes (exact in every case, so no scale has to live in the quantized matrix):
//  * q/k/v and gate/up: the preceding RMSNorm weight (attn_norm, ffn_norm), as AWQ does.
//  * down: the rows of up (silu(gate) * up is linear in up's output channels), as AWQ does.
//  * o: the rows of v (and v's bias): the attention output is a convex combination of v rows, so
//    channel d of head h scales with v's channel d of kv head h / group. With grouped-query
//    attention one v channel feeds group query heads, so o's scales are tied across the heads of a
//    group (their mean |x| is averaged) to keep the fold exact. AWQ skips o under GQA; kiln keeps
//    it with tied scales.
// The folded norms and v/up rows stay fp32/(re)quantized as their own format requires; v and up
// are quantized after all folds, so their int4 form already includes 1/s (a row scale commutes
// with per-row group quantization).
//
// Then, with `clip` (AWQ's auto_clip, session 9), each int4 group of each row of v, o, gate, up and
// down is clipped to +-r * amax(group), r in {1, 0.95, ..., 0.5}, for the r that minimizes that
// group's own output error over the calibration rows (x_g . (w_g - Q(clip(w_g))))^2 summed over
// rows x, i.e. d^T G d with G = X_g^T X_g, the inputs as the scaled weights see them (x / s). q and
// k stay unclipped, as in AWQ (the attention scores amplify their errors). r = 1 is a candidate,
// so on the calibration rows clipping never does worse than not clipping; cross-group error terms
// are ignored, as AWQ's objective does.
//
// Not done (vs the paper): a layer-output objective (kiln measures each matrix's own output
// error), and sequential re-calibration on the scaled model (activations are those of the
// unquantized model, one pass, as AWQ's scale search also uses).
#pragma once

#include <functional>
#include <string>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/calibration.h"

namespace kiln::quant {

struct AwqChoice {
  int64_t layer = 0;
  std::string group;     // "qkv", "o", "gate_up", "down"
  float alpha = 0;
  double error_rtn = 0;  // output error with plain round-to-nearest (alpha 0)
  double error = 0;      // with the chosen alpha
  // With clip: the per-group objective summed over the site's clipped matrices (none for q and
  // k), unclipped and with the chosen ratios (both after the scales); 0 / 0 without clip.
  double clip_error_before = 0, clip_error_after = 0;
};

// Rescales `w` in place (fp32; quantize afterwards with the same int4 group preference), and with
// `clip` clips it as described above. `on_choice` reports each group's choice.
void apply_awq(ModelWeights& w, const ModelConfig& config, const Calibration& cal, ThreadPool& pool,
               int64_t int4_group, bool clip, const std::function<void(const AwqChoice&)>& on_choice);

}  // namespace kiln::quant
