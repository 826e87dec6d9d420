// kiln quantize's options, and its calibration-driven passes (quantize_passes.cpp): the AWQ scale
// search with GPTQ and the gain fit after it, and the end-to-end grid tuning. cmd_quantize.cpp parses
// the options, runs the passes and writes the GGUF.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common.h"
#include "core/thread_pool.h"

namespace kiln::cli {

struct QuantizeOptions {
  std::string input, output, type, calib, head_type;
  // act-order and the MSE group ranges are on with --gptq since session 12 (full corpus: +6.40% vs
  // +9.26% perplexity for plain GPTQ; docs/QUANTIZATION.md); --no-gptq-act-order / --no-gptq-mse-grid.
  bool head = false, no_clip = false, gptq = false, gptq_act_order = true, gptq_mse_grid = true;
  // The clipping search serves round-to-nearest codes; before GPTQ it cost quality (session 13: full
  // corpus, docs/QUANTIZATION.md), so --gptq skips it unless --gptq-clip asks for it.
  bool gptq_clip = false;
  bool gptq_no_awq = false;  // GPTQ on the unscaled weights: no AWQ scale search (session 18's row)
  int32_t threads = 0;
  int64_t calib_tokens = 8192, calib_ctx = 512, calib_samples = 256, group = 128;
  // Rows a matrix input for GPTQ's Hessians: every calibration token up to this many (with 4096 of
  // 8192 the codes fit the calibration rows and did not lower the perplexity; docs/QUANTIZATION.md).
  int64_t gptq_samples = 16384;
  // Three refit rounds since session 14 (full corpus: +5.46% perplexity against +5.98% without;
  // docs/QUANTIZATION.md); --gptq-refit 0 turns the refit off.
  int gptq_refit = 3;  // GptqOptions::refit_rounds
  bool gptq_sequential = false;  // quant::apply_gptq_sequential
  double gptq_damp = 0.01;       // GptqOptions::damp
  // Two rounds of coordinate descent on the codes (each followed by a refit) since session 20 (full
  // corpus: +5.21% perplexity against +5.60% without; docs/QUANTIZATION.md); --gptq-descent 0: none.
  int gptq_descent = 2;          // GptqOptions::descent_rounds
  bool gptq_asymmetric = false;  // GptqOptions::asymmetric (implies --gptq-sequential)
  // The refit and descent on H damped by 10% of its mean diagonal since session 21 (full corpus:
  // +5.18% perplexity, mean KL 0.0723, against +5.21% and 0.0736 undamped; docs/QUANTIZATION.md).
  double gptq_fit_damp = 0.1;    // GptqOptions::fit_damp
  bool gain_fit = false;         // quant::fit_channel_gains after GPTQ (session 21)
  double gain_fit_ridge = 0.01;  // its ridge toward gains of 1, a share of mean diag A
  bool rotate = false;           // quant::rotate_model before anything else (session 22)
  uint64_t rotate_seed = 1;
  // quant::tune_int4_grids after the codes are set (session 22); 0: no tuning.
  int tune_epochs = 0;
  // 3e-4: on the first 8 evaluation windows 1e-3 (held, before the cosine decay) raised the mean KL
  // 0.0655 -> 0.0714 and 3e-4 lowered it to 0.0600 (session 22, docs/QUANTIZATION.md).
  double tune_lr = 3e-4;
  std::string tune_teacher;  // the unquantized model to tune against (default: the input as loaded)
  std::string tune_text;     // the text it tunes on (default: --calib)
  int64_t tune_tokens = 16384;
  bool tune_rows = false;    // GridTuneOptions::per_row
};

// The first `limit` tokens of a calibration text (at least --calib-ctx of them).
std::vector<int32_t> calibration_ids(const QuantizeOptions& o, const LoadedModel& model, const std::string& path,
                                     int64_t limit);

// --calib: the AWQ scale search (and clipping), then --gptq and --gain-fit, on `ids`.
void run_awq(const QuantizeOptions& o, LoadedModel& model, ThreadPool& pool, std::span<const int32_t> ids);

// --tune-epochs: every linear weight int4 (round to nearest where no pass set its codes), then the grids
// tuned end to end against `teacher` on `ids`.
void run_tuning(const QuantizeOptions& o, LoadedModel& model, const LoadedModel& teacher, ThreadPool& pool,
                std::span<const int32_t> ids);

// m is int4 with the group --group gives its rows; every linear weight is.
bool int4_at_group(const HostMatrix& m, int64_t group);
bool all_linear_int4(ModelWeights& w, int64_t group);
bool same_shapes(const ModelConfig& a, const ModelConfig& b);

}  // namespace kiln::cli
