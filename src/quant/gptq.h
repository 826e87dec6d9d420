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
// Options (GptqOptions, session 11): act-order (columns by decreasing diag H) with static groups,
// and an MSE-chosen group range. Session 14: a refit of each row's group grids to GPTQ's codes
// (refit_int4_grids), and the sequential form (apply_gptq_sequential: each site's inputs computed
// through the already-quantized matrices before it). Session 20: coordinate descent on the codes
// after the refit (int4_descent.h) and the sequential form's asymmetric calibration. Session 21: the
// refit and descent on a damped H (GptqOptions::fit_damp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/quantized_matrix.h"
#include "model/weights.h"
#include "quant/calibration.h"
#include "quant/quantize.h"

namespace kiln::quant {

// H = sum over the site's sampled rows of x x^T (cols x cols, row-major, double); the H summed during
// calibration when there is one (calibrate's hessian_rows).
std::vector<double> input_hessian(const SiteStats& site, ThreadPool& pool);

// U, the upper Cholesky factor of (H + damp I)^-1 (row-major, cols x cols, zero below the
// diagonal), with GPTQ's damping as above (damp: the first try's share of the mean diagonal).
// kiln::Error(internal) if no damping makes H + damp I positive definite.
std::vector<float> gptq_inverse_factor(const std::vector<double>& H, int64_t cols, double damp = 0.01);

// Session 11's options. act_order: columns quantized by decreasing diag H (the paper's act-order;
// the groups' grids then fixed before any update, GPTQ's "static groups", so the stored layout and
// kernels are unchanged). mse_grid: each group's grid is the [min, max] range shrunk by the factor
// in 1, 0.97, .., 0.73 with the least GPTQ loss sum e^2 / [H^-1]_ii over the group (else the
// range itself).
struct GptqOptions {
  bool act_order = false;
  bool mse_grid = false;
  std::vector<int64_t> order;  // gptq_int4: the columns' processing order (empty: natural); U must be of H permuted so
  // apply_gptq / apply_gptq_sequential: a refit of the grids to GPTQ's codes, then refit_rounds - 1
  // rounds of (GPTQ again on the last grids, held static; refit), each row keeping its best round;
  // 0: GPTQ's grids as they came (session 14).
  int refit_rounds = 0;
  double damp = 0.01;  // apply_gptq(_sequential): gptq_inverse_factor's first damping, a share of mean diag H
  // apply_gptq(_sequential), after the refit rounds: this many rounds of (coordinate descent on the
  // codes, int4_descent.h, at most descent_sweeps sweeps; a refit of the grids); 0: none (session 20).
  int descent_rounds = 0;
  int descent_sweeps = 16;
  // The refit and descent rounds minimize d^T (H + fit_damp * mean(diag H) I) d: a ridge on the
  // weight error, as GPTQ's damping is for its own pass; 0: H as it is (session 21).
  double fit_damp = 0;
  // apply_gptq_sequential only: asymmetric calibration (session 20, after GPTAQ: Li et al., 2025):
  // each site's matrices fit the unquantized model's outputs, W X, from the inputs X~ the quantized
  // layers before produce, instead of W X~: GPTQ (H = X~^T X~) on W* = W (C + D) (H + D)^-1,
  // C = X^T X~, D the damping, a ridge toward W (gptq_sequential.cpp). Measured worse than the
  // symmetric form on the default model (it fits the calibration text's drift; docs/QUANTIZATION.md).
  bool asymmetric = false;
  // gptq_int4 only: every (row, group)'s grid, fixed up front (rows x groups; apply_gptq ignores it).
  const std::vector<Int4Grid>* grids = nullptr;
};

// w (rows x cols) to int4 groups of `group` columns through GPTQ with the factor U above (of H, or
// of H permuted by opt.order when that is set).
QuantizedMatrix gptq_int4(const float* w, int64_t rows, int64_t cols, int64_t group, const std::vector<float>& U,
                          ThreadPool& pool, const GptqOptions& opt = {});
// Columns by decreasing diag H (ties in column order), and H with rows and columns in that order.
std::vector<int64_t> gptq_act_order(const std::vector<double>& H, int64_t cols);
std::vector<double> permuted_hessian(const std::vector<double>& H, const std::vector<int64_t>& order);
// A group's grid (gptq_int4's mse_grid above; loss_weight[k] = 1 / U_kk^2 for the group's columns).
Int4Grid gptq_group_grid(const float* v, const float* loss_weight, int64_t n, bool mse);

// With the codes of q fixed, each row's group scales and mins (2 * groups numbers) set to those that
// minimize the row's output error d^T H d, d = w - (code * scale + min): a least-squares problem in
// the grids alone, whose normal equations couple every group of the row through H (GPTQ spread each
// column's error over the other groups, so the grids it chose up front no longer fit the codes
// best). A row keeps its grids where the solve does not lower its error. Returns the rows changed.
int64_t refit_int4_grids(const float* w, QuantizedMatrix& q, const std::vector<double>& H, ThreadPool& pool);
// q's grids, row-major (row * groups + g): what opt.grids takes.
std::vector<Int4Grid> int4_grids_of(const QuantizedMatrix& q);

// sum over rows of d^T H d, d = w - dequantize(q): the output error GPTQ minimizes (for the report).
double hessian_error(const float* w, const QuantizedMatrix& q, const std::vector<double>& H, ThreadPool& pool);
// The same, one entry per row.
std::vector<double> hessian_row_errors(const float* w, const QuantizedMatrix& q, const std::vector<double>& H,
                                       ThreadPool& pool);

struct GptqReport {
  int64_t layer = 0;
  std::string matrix;   // "q", "k", "v", "o", "gate", "up", "down"
  double error_rtn = 0;  // hessian_error of round-to-nearest (quantize_int4)
  double error = 0;      // of GPTQ
  int64_t descent_moves = 0;        // codes the coordinate descent changed (GptqOptions::descent_rounds)
  double error_before_descent = 0;  // `error` as GPTQ and the refit rounds left it, when descent ran
};

// Quantizes every layer's q, k, v, o, gate, up and down to int4 through GPTQ, with the Hessians of
// cal (which must be a calibration of `w` as it is now, AWQ scales included): each matrix's quant
// is set and its data replaced by the dequantization, as quantize_matrix does.
void apply_gptq(ModelWeights& w, const Calibration& cal, ThreadPool& pool, int64_t int4_group,
                const std::function<void(const GptqReport&)>& on_matrix, const GptqOptions& options = {});

// GPTQ in the paper's "true sequential" order (session 14; gptq_sequential.cpp): every window of `tokens` runs through
// one batched forward of the CPU reference, and each site's matrices are quantized when the
// forward reaches them, from the H of the inputs that the already-quantized matrices before them
// (earlier layers, and q/k/v before o, o before gate/up, gate/up before down) produce -- where
// apply_gptq takes every H from one calibration of the unquantized model. The same per-site
// quantization (and refit rounds) as apply_gptq. Holds every window's activations and K/V at once:
// the caller checks the memory (sequential_gptq_bytes).
void apply_gptq_sequential(const ModelConfig& config, ModelWeights& w, ThreadPool& pool,
                           std::span<const int32_t> tokens, int64_t window, int64_t int4_group,
                           const std::function<void(const GptqReport&)>& on_matrix, const GptqOptions& options = {});
// With options.asymmetric it first runs the windows through the unquantized model and keeps every
// site's inputs (sequential_gptq_bytes counts them).
// What apply_gptq_sequential holds beyond the weights for `rows` calibration tokens (bytes, about).
double sequential_gptq_bytes(const ModelConfig& config, int64_t rows, bool asymmetric = false);

}  // namespace kiln::quant
