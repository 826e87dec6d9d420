// GPTQ for kiln's int4 format (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for
// Generative Pre-trained Transformers"), as `kiln quantize --gptq` runs it after the AWQ scales
// (awq.h).
//
// Round-to-nearest quantizes each weight on its own. GPTQ quantizes a row's columns in order and
// spreads each column's rounding error over the columns not yet quantized, weighted so that the
// row's output error on the calibration inputs, d^T H d with H = sum over rows x of x x^T and d the
// row's weight error, is what is minimized (the OBS update): with U the upper Cholesky factor of
// H^-1, quantizing column i with error e moves column j > i by -e * U[i][j] / U[i][i]. Rows are
// independent (each has its own groups), so they run in parallel against one U per input site
// (q, k and v share theirs, as do gate and up).
//
// kiln's int4 groups (quantize.h: scale = (max - min) / 15, a free fp32 min) are taken from the row's
// updated weights when the group's first column is reached, as GPTQ's group-wise form does; the
// result is a QuantizedMatrix (re-quantizing its dequantized values would not reproduce it: a group
// need not use the codes 0 and 15).
//
// Damping: H + 0.01 * mean(diag H) * I (the paper's default), ten times more until the Cholesky
// factorization succeeds. Columns whose input is always zero (diag 0) get diag 1.
//
// Not done (vs the paper): act-order (columns by decreasing diag H), the sequential form (each
// layer's inputs recomputed through the already-quantized layers before it): kiln calibrates once
// on the fp32 model with the AWQ scales folded in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/quantized_matrix.h"
#include "model/weights.h"
#include "quant/calibration.h"

namespace kiln::quant {

// H = sum over the site's sampled rows of x x^T (cols x cols, row-major, double).
std::vector<double> input_hessian(const SiteStats& site, ThreadPool& pool);

// U, the upper Cholesky factor of (H + damp I)^-1 (row-major, cols x cols, zero below the
// diagonal), with GPTQ's damping as above. kiln::Error(internal) if no damping makes H + damp I
// positive definite.
std::vector<float> gptq_inverse_factor(const std::vector<double>& H, int64_t cols);

// w (rows x cols) to int4 groups of `group` columns through GPTQ with the factor U above.
QuantizedMatrix gptq_int4(const float* w, int64_t rows, int64_t cols, int64_t group, const std::vector<float>& U,
                          ThreadPool& pool);

// sum over rows of d^T H d, d = w - dequantize(q): the output error GPTQ minimizes (for the report).
double hessian_error(const float* w, const QuantizedMatrix& q, const std::vector<double>& H, ThreadPool& pool);

struct GptqReport {
  int64_t layer = 0;
  std::string matrix;   // "q", "k", "v", "o", "gate", "up", "down"
  double error_rtn = 0;  // hessian_error of round-to-nearest (quantize_int4)
  double error = 0;      // of GPTQ
};

// Quantizes every layer's q, k, v, o, gate, up and down to int4 through GPTQ, with the Hessians of
// cal (which must be a calibration of `w` as it is now, AWQ scales included): each matrix's quant
// is set and its data replaced by the dequantization, as quantize_matrix does.
void apply_gptq(ModelWeights& w, const Calibration& cal, ThreadPool& pool, int64_t int4_group,
                const std::function<void(const GptqReport&)>& on_matrix);

}  // namespace kiln::quant
