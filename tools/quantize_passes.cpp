// The passes of kiln quantize that need a calibration text (quantize_options.h).
#include <chrono>

#include <unistd.h>  // sysconf: the memory --gptq may use

#include <fmt/core.h>

#include "core/check.h"
#include "model/gguf/gguf_names.h"
#include "quant/awq.h"
#include "quant/calibration.h"
#include "quant/gain_fit.h"
#include "quant/gptq.h"
#include "quant/grid_tuning.h"
#include "quant/quantize.h"
#include "quant/quantize_model.h"
#include "quantize_options.h"

namespace kiln::cli {
namespace {

// The machine's memory in bytes (0 when unknown): what the GPTQ and gain-fit passes check against.
double machine_bytes() { return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)); }

// The calibration rows the one-forward passes (sequential GPTQ, gain fit) run: whole windows of
// --calib-ctx, up to --gptq-samples, at least one.
int64_t forward_rows(const QuantizeOptions& o, std::span<const int32_t> ids) {
  return std::max<int64_t>(1, std::min<int64_t>(o.gptq_samples, int64_t(ids.size())) / o.calib_ctx) * o.calib_ctx;
}

// GPTQ on the (scaled) model: apply_gptq from a second calibration, or the sequential forms.
void run_gptq(const QuantizeOptions& o, LoadedModel& model, ThreadPool& pool, std::span<const int32_t> ids) {
  auto t0 = std::chrono::steady_clock::now();
  quant::GptqOptions gopt;
  gopt.act_order = o.gptq_act_order;
  gopt.mse_grid = o.gptq_mse_grid;
  gopt.refit_rounds = o.gptq_refit;
  gopt.damp = o.gptq_damp;
  gopt.descent_rounds = o.gptq_descent;
  gopt.fit_damp = o.gptq_fit_damp;
  gopt.asymmetric = o.gptq_asymmetric;
  auto report = [](const quant::GptqReport& r) {
    fmt::print(stderr, "  layer {:3} {:<5} output error {:.4g} (round to nearest) -> {:.4g} ({:+.1f}%){}\n", r.layer,
               r.matrix, r.error_rtn, r.error, r.error_rtn > 0 ? 100.0 * (r.error / r.error_rtn - 1.0) : 0.0,
               r.descent_moves > 0 ? fmt::format("; descent moved {} codes, from {:.4g} ({:+.1f}%)", r.descent_moves,
                                                 r.error_before_descent,
                                                 100.0 * (r.error / r.error_before_descent - 1.0))
                                   : std::string());
  };
  const double have = machine_bytes();
  if (o.gptq_sequential || o.gptq_asymmetric) {
    // Every window at once through the CPU reference, each site quantized as the forward reaches it.
    const int64_t rows = forward_rows(o, ids);
    const double need = quant::sequential_gptq_bytes(model.config, rows, o.gptq_asymmetric);
    KILN_CHECK(have <= 0 || need < 0.7 * have, unsupported,
               "{} would hold {:.1f} GB of activations for {} calibration rows, more than 70% of this "
               "machine's {:.1f} GB: lower --gptq-samples", o.gptq_asymmetric ? "--gptq-asymmetric" : "--gptq-sequential",
               need / 1e9, rows, have / 1e9);
    t0 = std::chrono::steady_clock::now();
    fmt::print(stderr,
               "kiln quantize: GPTQ in sequence{} ({} rows in one batched forward, each site quantized as it is reached; "
               "act-order {}, MSE group ranges {}, refit rounds {}, descent rounds {}):\n",
               o.gptq_asymmetric ? ", asymmetric" : "", rows, o.gptq_act_order ? "on" : "off", o.gptq_mse_grid ? "on" : "off", o.gptq_refit,
               o.gptq_descent);
    quant::apply_gptq_sequential(model.config, model.weights, pool, std::span<const int32_t>(ids).first(size_t(rows)),
                                 o.calib_ctx, o.group, report, gopt);
    fmt::print(stderr, "kiln quantize: GPTQ done in {:.1f} s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return;
  }
  // GPTQ needs the inputs as the scaled (and clipped) matrices see them: a second calibration of
  // the model as it now is. Its Hessians come either from kept rows (rows x cols a site) or summed as
  // the rows pass (cols x cols a site, whatever the row count): the smaller of the two, held for
  // every layer at once; refuse up front what would not fit in memory.
  const ModelConfig& c = model.config;
  const int64_t rows = std::min<int64_t>(o.gptq_samples, int64_t(ids.size()));
  const double row_bytes = 4.0 * double(2 * c.hidden_size + c.q_dim() + c.intermediate_size);
  const double hessian_bytes = 8.0 * (2.0 * double(c.hidden_size) * double(c.hidden_size) +
                                      double(c.q_dim()) * double(c.q_dim()) +
                                      double(c.intermediate_size) * double(c.intermediate_size));
  const bool summed = hessian_bytes < double(rows) * row_bytes;
  const double need = double(c.n_layers) * (summed ? hessian_bytes : double(rows) * row_bytes) +
                      // one site's H, its damped copy, the factors and inverses gptq_inverse_factor holds,
                      // act-order's permuted copy and U: about 7 n^2 doubles at the widest input
                      8.0 * 7.0 * double(c.intermediate_size) * double(c.intermediate_size);
  KILN_CHECK(have <= 0 || need < 0.7 * have, unsupported,
             "--gptq would hold {:.1f} GB of calibration {} ({} rows x {} layers), more than 70% of this machine's "
             "{:.1f} GB: lower --gptq-samples", need / 1e9, summed ? "Hessians" : "rows and Hessians", rows,
             c.n_layers, have / 1e9);
  t0 = std::chrono::steady_clock::now();
  fmt::print(stderr,
             "kiln quantize: calibrating the {} model for GPTQ ({} rows a site, {}; act-order {}, MSE group ranges "
             "{}) ...\n",
             o.gptq_no_awq ? "unscaled" : "scaled", rows, summed ? "Hessians summed as they pass" : "rows kept", o.gptq_act_order ? "on" : "off",
             o.gptq_mse_grid ? "on" : "off");
  const quant::Calibration cal = summed ? quant::calibrate(model.config, model.weights, pool, ids, o.calib_ctx, 0, o.gptq_samples)
               : quant::calibrate(model.config, model.weights, pool, ids, o.calib_ctx, o.gptq_samples);
  fmt::print(stderr, "kiln quantize: calibration done in {:.1f} s; GPTQ (int4, damping {}% of mean diag, refit rounds {}, "
             "descent rounds {}):\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 100 * o.gptq_damp, o.gptq_refit,
             o.gptq_descent);
  quant::apply_gptq(model.weights, cal, pool, o.group, report, gopt);
}

}  // namespace

std::vector<int32_t> calibration_ids(const QuantizeOptions& o, const LoadedModel& model, const std::string& path,
                                     int64_t limit) {
  const Tokenizer& tokenizer = require_tokenizer(model);
  std::string text = read_text_file(path, "calibration text");
  std::vector<int32_t> ids = tokenizer.encode(text, tokenizer.add_bos_default(), false);
  if (int64_t(ids.size()) > limit) ids.resize(size_t(limit));
  KILN_CHECK(int64_t(ids.size()) >= o.calib_ctx, invalid_argument,
             "the calibration text '{}' has {} tokens; it needs at least --calib-ctx = {}", path, ids.size(),
             o.calib_ctx);
  return ids;
}

void run_awq(const QuantizeOptions& o, LoadedModel& model, ThreadPool& pool, std::span<const int32_t> ids) {
  const bool clip = !o.no_clip && (!o.gptq || o.gptq_clip);
  auto t0 = std::chrono::steady_clock::now();
  quant::Calibration cal;
  if (!o.gptq_no_awq) {
    fmt::print(stderr, "kiln quantize: calibrating on {} tokens of '{}' (windows of {}) ...\n",
               ids.size() / size_t(o.calib_ctx) * size_t(o.calib_ctx), o.calib, o.calib_ctx);
    cal = quant::calibrate(model.config, model.weights, pool, ids, o.calib_ctx, o.calib_samples);
    fmt::print(stderr, "kiln quantize: calibration done in {:.1f} s; AWQ scale search (alpha in 0..1, 21 points){}:\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               clip ? ", then the clipping search (ratio 1..0.5, 11 points; not q, k)" : "");
    quant::apply_awq(model.weights, model.config, cal, pool, o.group, clip, [](const quant::AwqChoice& ch) {
      std::string clip;
      if (ch.clip_error_before > 0)
        clip = fmt::format("; clipped {:.4g} -> {:.4g} ({:+.1f}%)", ch.clip_error_before, ch.clip_error_after,
                           100.0 * (ch.clip_error_after / ch.clip_error_before - 1.0));
      fmt::print(stderr, "  layer {:3} {:<8} alpha {:.2f}  output error {:.4g} -> {:.4g} ({:+.1f}%){}\n", ch.layer,
                 ch.group, ch.alpha, ch.error_rtn, ch.error,
                 ch.error_rtn > 0 ? 100.0 * (ch.error / ch.error_rtn - 1.0) : 0.0, clip);
    });
  }
  if (!o.gptq) return;
  // The gain fit's target: the model as GPTQ receives it (AWQ scales folded in), unquantized.
  ModelWeights reference;
  const int64_t rows = forward_rows(o, ids);
  if (o.gain_fit) {
    const double have = machine_bytes();
    const double need = quant::gain_fit_bytes(model.config, rows) + 2.0 * 4.0 * double(model.config.n_params());
    KILN_CHECK(have <= 0 || need < 0.7 * have, unsupported,
               "--gain-fit would hold {:.1f} GB (two fp32 copies of the model and the activations of {} calibration "
               "rows), more than 70% of this machine's {:.1f} GB: lower --gptq-samples",
               need / 1e9, rows, have / 1e9);
    reference = model.weights;
  }
  run_gptq(o, model, pool, ids);
  if (!o.gain_fit) return;
  t0 = std::chrono::steady_clock::now();
  fmt::print(stderr, "kiln quantize: fitting input-channel gains to the unquantized model ({} rows, ridge {}):\n",
             rows, o.gain_fit_ridge);
  quant::fit_channel_gains(model.config, std::move(reference), model.weights, pool,
                           std::span<const int32_t>(ids).first(size_t(rows)), o.calib_ctx,
                           o.gain_fit_ridge, [](const quant::GainFitReport& r) {
                             fmt::print(stderr, "  layer {:3} {:<7} output error {:.4g} -> {:.4g} ({:+.1f}%){}\n",
                                        r.layer, r.site, r.error_before, r.error_after,
                                        r.error_before > 0 ? 100.0 * (r.error_after / r.error_before - 1.0) : 0.0,
                                        r.kept ? fmt::format("; gains {:.3f} .. {:.3f}", r.min_gain, r.max_gain)
                                               : std::string("; gains kept at 1"));
                           });
  fmt::print(stderr, "kiln quantize: gain fit done in {:.1f} s\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

bool int4_at_group(const HostMatrix& m, int64_t group) {
  return m.quant.format == QuantFormat::int4 && m.quant.group_size == quant::int4_group_for(m.cols, group);
}

bool all_linear_int4(ModelWeights& w, int64_t group) {
  for (const auto& [name, m] : gguf::named_tensors(w))
    if (gguf::is_linear_weight(name) && !int4_at_group(*m, group)) return false;
  return true;
}

bool same_shapes(const ModelConfig& a, const ModelConfig& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.n_layers == b.n_layers && a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads && a.head_dim == b.head_dim;
}

void run_tuning(const QuantizeOptions& o, LoadedModel& model, const LoadedModel& teacher, ThreadPool& pool,
                std::span<const int32_t> ids) {
  const double have = machine_bytes(),
               need = quant::grid_tuning_bytes(model.config, int64_t(ids.size()), o.calib_ctx) +
                      4.0 * double(model.config.n_params());
  KILN_CHECK(have <= 0 || need < 0.7 * have, unsupported,
             "--tune-epochs would hold {:.1f} GB (the teacher's log-probabilities of {} calibration tokens, one "
             "window's activations, a second model), more than 70% of this machine's {:.1f} GB: lower {}",
             need / 1e9, ids.size(), have / 1e9, o.tune_text.empty() ? "--calib-tokens" : "--tune-tokens");
  for (auto& [name, m] : gguf::named_tensors(model.weights))
    if (gguf::is_linear_weight(name) && !int4_at_group(*m, o.group))
      quant::quantize_matrix(*m, quant::TargetType::int4, o.group);
  const int64_t windows = int64_t(ids.size()) / o.calib_ctx;
  fmt::print(stderr, "kiln quantize: tuning the int4 grids end to end ({}; {} epochs of {} windows of {}, Adam rate {}; "
                     "teacher {}):\n",
             o.tune_rows ? "one gain a row" : "every group's scale and min", o.tune_epochs, windows, o.calib_ctx, o.tune_lr, o.tune_teacher.empty() ? "the input" : o.tune_teacher);
  quant::GridTuneOptions t;
  t.epochs = o.tune_epochs;
  t.lr = o.tune_lr;
  t.window = o.calib_ctx;
  t.per_row = o.tune_rows;
  double epoch_kl = 0;
  const auto t0 = std::chrono::steady_clock::now();
  quant::tune_int4_grids(model.config, teacher.weights, model.weights, pool, ids, t,
                         [&](const quant::GridTuneReport& r) {
                           epoch_kl += r.kl;
                           fmt::print(stderr, "  epoch {} window {:3}/{}: mean KL {:.5f} ({:.1f} s)\n", r.epoch + 1,
                                      r.window + 1, r.windows, r.kl, r.seconds);
                           if (r.window + 1 == r.windows) {
                             fmt::print(stderr, "  epoch {}: mean KL over its windows {:.5f}\n", r.epoch + 1,
                                        epoch_kl / double(r.windows));
                             epoch_kl = 0;
                           }
                         });
  fmt::print(stderr, "kiln quantize: tuning done in {:.1f} s (the teacher's log-probabilities included)\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace kiln::cli
