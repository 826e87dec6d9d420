// kiln quantize IN.gguf OUT.gguf --type int8|int4|fp8|bf16 [--head] [--head-type T] [--calib FILE]: rewrites a GGUF
// with every linear weight (q, k, v, o, gate, up, down) in kiln's format, one progress line per
// tensor as llama-quantize prints them; everything else (embeddings, norms, output head, tokenizer,
// chat template and all other metadata) is kept. --head quantizes the output head too (a model
// whose head is tied to the embedding gets a quantized copy as output.weight; the embedding stays);
// --head-type gives it a type of its own (an int4 model with an int8 head, as llama.cpp keeps the
// head at 6 bits in its Q4_0 files). --type bf16 writes the weights (embeddings and head
// included) rounded to bf16: the reference model the quality table measures the formats against.
// --calib runs the AWQ-style scale search and then the clipping search (src/quant/awq.h; --no-clip:
// scales only) for int4 on a calibration text; --gptq then calibrates the scaled model again and
// rounds the int4 codes through GPTQ (src/quant/gptq.h) instead of to nearest.
// Byte layouts and metadata keys: docs/QUANTIZATION.md.
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <unistd.h>  // sysconf: the memory --gptq may use

#include <fmt/core.h>

#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "core/dtype.h"
#include "model/gguf/ggml_types.h"
#include "model/gguf/gguf_names.h"
#include "model/gguf/gguf_quant.h"
#include "model/gguf/gguf_writer.h"
#include "quant/awq.h"
#include "quant/calibration.h"
#include "quant/gain_fit.h"
#include "quant/gptq.h"
#include "quant/quantize.h"
#include "quant/quantize_model.h"

namespace kiln::cli {
namespace {

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
};

uint32_t kiln_type_of(QuantFormat f) {
  switch (f) {
    case QuantFormat::int8: return uint32_t(gguf::GgmlType::KILN_INT8);
    case QuantFormat::int4: return uint32_t(gguf::GgmlType::KILN_INT4);
    case QuantFormat::fp8: return uint32_t(gguf::GgmlType::KILN_FP8);
    case QuantFormat::none: break;
  }
  KILN_FAIL(internal, "no kiln type for an unquantized matrix");
}

std::vector<uint8_t> bf16_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> b(values.size() * 2);
  for (size_t k = 0; k < values.size(); ++k) {
    const uint16_t h = f32_to_bf16(values[k]);
    std::memcpy(b.data() + 2 * k, &h, 2);
  }
  return b;
}

constexpr const char* kHeadName = "output.weight";
constexpr const char* kEmbedName = "token_embd.weight";

// The tensors this run rewrites in the target type: the linear weights, and the head with --head.
bool quantized_here(const QuantizeOptions& o, const std::string& name) {
  return gguf::is_linear_weight(name) || (o.head && name == kHeadName);
}

// A kiln input's ".scales"/".mins" of a tensor this run rewrites: rewritten with it, never copied.
bool is_rewritten_companion(const QuantizeOptions& o, const gguf::GgufFile& f, const std::string& name) {
  for (std::string_view suffix : {".scales", ".mins"}) {
    if (!name.ends_with(suffix)) continue;
    const std::string base = name.substr(0, name.size() - suffix.size());
    const gguf::TensorInfo* t = f.find_tensor(base);
    if (t && gguf::is_kiln_type(t->type) && quantized_here(o, base)) return true;
  }
  return false;
}

double mib(uint64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

std::string type_label(uint32_t type) {
  std::string s(gguf::type_traits(type)->name);
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

void run_gptq(const QuantizeOptions& o, LoadedModel& model, ThreadPool& pool, std::span<const int32_t> ids);

// The machine's memory in bytes (0 when unknown): what the GPTQ and gain-fit passes check against.
double machine_bytes() { return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)); }

// The calibration rows the one-forward passes (sequential GPTQ, gain fit) run: whole windows of
// --calib-ctx, up to --gptq-samples, at least one.
int64_t forward_rows(const QuantizeOptions& o, std::span<const int32_t> ids) {
  return std::max<int64_t>(1, std::min<int64_t>(o.gptq_samples, int64_t(ids.size())) / o.calib_ctx) * o.calib_ctx;
}

void run_awq(const QuantizeOptions& o, LoadedModel& model, ThreadPool& pool) {
  const Tokenizer& tokenizer = require_tokenizer(model);
  std::string text = read_text_file(o.calib, "calibration text");
  std::vector<int32_t> ids = tokenizer.encode(text, tokenizer.add_bos_default(), false);
  if (int64_t(ids.size()) > o.calib_tokens) ids.resize(size_t(o.calib_tokens));
  KILN_CHECK(int64_t(ids.size()) >= o.calib_ctx, invalid_argument,
             "the calibration text '{}' has {} tokens; it needs at least --calib-ctx = {}", o.calib, ids.size(),
             o.calib_ctx);
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

void quantize(const QuantizeOptions& o) {
  namespace fs = std::filesystem;
  const quant::TargetType target = quant::parse_target_type(o.type);
  KILN_CHECK(o.calib.empty() || target == quant::TargetType::int4, invalid_argument,
             "--calib (the AWQ scale search) applies to --type int4 only");
  KILN_CHECK(!o.gptq || !o.calib.empty(), invalid_argument, "--gptq needs a calibration text (--calib)");
  KILN_CHECK(o.gptq_samples >= 1, invalid_argument, "--gptq-samples must be at least 1");
  KILN_CHECK(!(o.gptq_no_awq && o.gptq_clip), invalid_argument,
             "--gptq-clip runs with the AWQ search, which --gptq-no-awq skips");
  // The head's type: --head-type, else --type (with --head).
  const quant::TargetType head_target = o.head_type.empty() ? target : quant::parse_target_type(o.head_type);
  KILN_CHECK(!o.head || head_target != quant::TargetType::bf16, invalid_argument,
             "--head applies to int8, int4 and fp8 (bf16 rounds the head already)");
  KILN_CHECK(o.group >= 32 && o.group <= 4096 && (o.group & (o.group - 1)) == 0, invalid_argument,
             "--group must be a power of two from 32 to 4096, got {}", o.group);
  KILN_CHECK(fs::exists(o.input), io, "input '{}' does not exist", o.input);
  KILN_CHECK(!fs::is_directory(o.input), unsupported,
             "'{}' is a directory: kiln quantize reads GGUF files only (it keeps the GGUF's tokenizer and chat "
             "template, which kiln cannot yet write from a Hugging Face tokenizer.json); convert the directory with "
             "llama.cpp's convert_hf_to_gguf.py --outtype bf16 first",
             o.input);
  KILN_CHECK(fs::weakly_canonical(o.input) != fs::weakly_canonical(o.output), invalid_argument,
             "the output must not be the input file");

  ThreadPool pool(o.threads);
  LoadedModel model = load_with_progress(o.input, pool);
  gguf::GgufFile in = gguf::GgufFile::open(o.input);
  if (!o.calib.empty()) run_awq(o, model, pool);

  gguf::GgufWriter out;
  for (const auto& [key, value] : in.metadata()) out.set(key, value);
  out.set_string(gguf::kQuantTypeKey, std::string(quant::target_name(target)));
  out.set_u32(gguf::kQuantVersionKey, 1);
  out.set_bool(gguf::kQuantAwqKey, !o.calib.empty() && !o.gptq_no_awq);
  if (o.gptq) out.set_bool(gguf::kQuantGptqKey, true);
  else out.erase(gguf::kQuantGptqKey);
  // Without --head an input's head is kept as it is: still quantized if an earlier --head made it so
  // (its head_type key then stays true too).
  const gguf::TensorInfo* in_head = in.find_tensor(kHeadName);
  const bool kept_quantized_head = !o.head && in_head && gguf::is_kiln_type(in_head->type);
  out.set_bool(gguf::kQuantHeadKey, o.head || kept_quantized_head);
  if (o.head) out.set_string(gguf::kQuantHeadTypeKey, std::string(quant::target_name(head_target)));
  else if (!kept_quantized_head) out.erase(gguf::kQuantHeadTypeKey);
  if (target == quant::TargetType::int4 || (o.head && head_target == quant::TargetType::int4))
    out.set_u32(gguf::kQuantGroupKey, uint32_t(o.group));
  if (target == quant::TargetType::bf16) out.set_u32("general.file_type", 32);  // LLAMA_FTYPE_MOSTLY_BF16
  else out.erase("general.file_type");  // llama.cpp's enum has no value for kiln's types

  // m quantized (or rounded to bf16) in place and written as `name` (with its scales / mins); bytes written.
  auto write_quantized = [&](const std::string& name, const std::vector<uint64_t>& ne, HostMatrix& m) -> uint64_t {
    const quant::TargetType to = name == kHeadName ? head_target : target;
    // GPTQ (--gptq) set the int4 codes already; re-quantizing their dequantized values would not
    // give them back (a group need not use the codes 0 and 15).
    const bool by_gptq = o.gptq && to == quant::TargetType::int4 && name != kHeadName &&
                         m.quant.format == QuantFormat::int4 &&
                         m.quant.group_size == quant::int4_group_for(m.cols, o.group);
    if (!by_gptq) quant::quantize_matrix(m, to, o.group);
    if (to == quant::TargetType::bf16) {
      out.add_tensor(name, ne, uint32_t(gguf::GgmlType::BF16), bf16_bytes(m.data));
      return m.data.size() * 2;
    }
    const QuantizedMatrix& q = m.quant;
    const std::vector<uint64_t> scale_ne = {uint64_t(q.groups()), uint64_t(q.rows)};
    out.add_tensor(name, ne, kiln_type_of(q.format), std::span<const uint8_t>(q.q));
    out.add_tensor(name + ".scales", scale_ne, uint32_t(gguf::GgmlType::F32), gguf::f32_bytes(q.scales));
    uint64_t written = q.q.size() + q.scales.size() * 4;
    if (!q.mins.empty()) {
      out.add_tensor(name + ".mins", scale_ne, uint32_t(gguf::GgmlType::F32), gguf::f32_bytes(q.mins));
      written += q.mins.size() * 4;
    }
    return written;
  };
  auto converted_label = [&](const HostMatrix& m) {
    return m.quant.format == QuantFormat::none ? std::string("bf16") : type_label(kiln_type_of(m.quant.format));
  };

  std::map<std::string, HostMatrix*> named = gguf::named_tensors(model.weights);
  const bool copy_tied_head = o.head && !in.find_tensor(kHeadName);  // checked before any work is done
  KILN_CHECK(!copy_tied_head || (in.find_tensor(kEmbedName) && named.count(kEmbedName)), invalid_model,
             "--head: the model has neither {} nor {}", kHeadName, kEmbedName);
  const size_t n = in.tensors().size();
  uint64_t bytes_in = 0, bytes_out = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) {
    const gguf::TensorInfo& t = in.tensors()[i];
    if (is_rewritten_companion(o, in, t.name)) continue;
    auto it = named.find(t.name);
    HostMatrix* m = it == named.end() ? nullptr : it->second;
    std::string shape;
    for (size_t d = 0; d < 4; ++d) shape += fmt::format("{}{:5}", d ? ", " : "", d < t.ne.size() ? t.ne[d] : 1);
    fmt::print(stderr, "[{:4}/{:4}] {:>36} - [{}], type = {:>6}, ", i + 1, n, t.name, shape, type_label(t.type));
    bytes_in += t.n_bytes;
    uint64_t written = 0;
    if (m && quantized_here(o, t.name)) {
      written = write_quantized(t.name, t.ne, *m);
      fmt::print(stderr, "converting to {} .. size = {:8.2f} MiB -> {:8.2f} MiB\n", converted_label(*m), mib(t.n_bytes),
                 mib(written));
    } else if (m && m->rows == 1) {
      // Norms and biases: fp32 from the loaded values (AWQ may have folded scales into them).
      written = m->data.size() * 4;
      out.add_tensor(t.name, t.ne, uint32_t(gguf::GgmlType::F32), gguf::f32_bytes(m->data));
      fmt::print(stderr, "size = {:8.3f} MiB (f32)\n", mib(written));
    } else if (m && target == quant::TargetType::bf16) {
      quant::quantize_matrix(*m, target);
      written = m->data.size() * 2;
      out.add_tensor(t.name, t.ne, uint32_t(gguf::GgmlType::BF16), bf16_bytes(m->data));
      fmt::print(stderr, "converting to bf16 .. size = {:8.2f} MiB -> {:8.2f} MiB\n", mib(t.n_bytes), mib(written));
    } else {
      written = t.n_bytes;
      out.add_tensor(t.name, t.ne, t.type, std::span<const uint8_t>(t.data, t.n_bytes));
      fmt::print(stderr, "size = {:8.2f} MiB (kept)\n", mib(written));
    }
    bytes_out += written;
  }
  // --head on a model whose head is the embedding: a quantized copy becomes output.weight (the loader
  // then unties the head); the embedding itself stays as it was.
  HostMatrix head;  // lives until the write: add_tensor keeps a view of its quantized bytes
  if (copy_tied_head) {
    const gguf::TensorInfo* e = in.find_tensor(kEmbedName);
    head = *named.at(kEmbedName);
    fmt::print(stderr, "[   +/{:4}] {:>36} - a copy of {} (tied head), ", n, kHeadName, kEmbedName);
    const uint64_t written = write_quantized(kHeadName, e->ne, head);
    fmt::print(stderr, "converting to {} .. size = {:8.2f} MiB\n", converted_label(head), mib(written));
    bytes_out += written;
  }
  const uint64_t file_bytes = out.write(o.output);
  fmt::print(stderr, "kiln quantize: model size = {:.2f} MiB, quantized size = {:.2f} MiB ({})\n", mib(bytes_in),
             mib(bytes_out), quant::target_name(target));
  fmt::print(stderr, "kiln quantize: wrote {} ({:.2f} MiB) in {:.1f} s\n", o.output, mib(file_bytes),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "Quantize a GGUF's linear weights to int8, int4 or fp8 (or bf16)");
  cmd->add_option("input", o->input, "Input model (.gguf)")->required();
  cmd->add_option("output", o->output, "Output .gguf")->required();
  cmd->add_option("--type", o->type, "int8 (per channel), int4 (group 128), fp8 (E4M3 per channel) or bf16")
      ->required();
  cmd->add_flag("--head", o->head,
               "Quantize the output head too (a tied head: a quantized copy of the embedding as output.weight)");
  cmd->add_option("--head-type", o->head_type, "The head's type with --head: int8, int4 or fp8 (default: --type)")
      ->check(CLI::IsMember({"int8", "int4", "fp8"}));
  cmd->add_option("--group", o->group, "int4: columns per scale (halved until it divides a row, down to 32)")
      ->capture_default_str();
  cmd->add_option("--calib", o->calib, "int4: a calibration text for the AWQ-style scale search");
  cmd->add_option("--calib-tokens", o->calib_tokens, "Calibration tokens used (from the start of --calib)")
      ->capture_default_str();
  cmd->add_option("--calib-ctx", o->calib_ctx, "Calibration window in tokens")->capture_default_str();
  cmd->add_flag("--no-clip", o->no_clip,
                "--calib: the scale search only, without AWQ's weight-clipping search (the session-8 files)");
  CLI::Option* gptq = cmd->add_flag(
      "--gptq", o->gptq, "--calib, int4: after the AWQ scales, round the codes through GPTQ, not to nearest");
  cmd->add_option("--gptq-samples", o->gptq_samples, "--gptq: calibration rows per matrix input for its Hessians (evenly spaced over --calib-tokens)")
      ->capture_default_str();
  cmd->add_flag("--gptq-clip", o->gptq_clip,
                "--gptq: run AWQ's clipping search before GPTQ too (off by default since session 13)")
      ->needs(gptq);
  cmd->add_flag("--gptq-no-awq", o->gptq_no_awq,
                "--gptq: skip the AWQ scale search; GPTQ rounds the unscaled weights (its Hessians from --calib)")
      ->needs(gptq);
  cmd->add_flag("--gptq-act-order,!--no-gptq-act-order", o->gptq_act_order,
                "--gptq: quantize columns by decreasing input energy (act-order), group grids fixed up front "
                "(default on)")
      ->needs(gptq);
  cmd->add_flag("--gptq-mse-grid,!--no-gptq-mse-grid", o->gptq_mse_grid,
                "--gptq: each group's range shrunk to the factor with the least GPTQ loss (default on)")
      ->needs(gptq);
  cmd->add_option("--gptq-refit", o->gptq_refit,
                  "--gptq: rounds of refitting every group's scale and min to GPTQ's codes (least squares "
                  "in the output error), each after the first preceded by GPTQ again on the refit grids; 0: none")
      ->check(CLI::Range(0, 8))
      ->needs(gptq)
      ->capture_default_str();
  cmd->add_option("--gptq-damp", o->gptq_damp,
                  "--gptq: H's damping, a share of its mean diagonal (x10 until H + damp I factors)")
      ->check(CLI::Range(1e-6, 1.0))
      ->needs(gptq)
      ->capture_default_str();
  cmd->add_option("--gptq-descent", o->gptq_descent,
                  "--gptq: after the refit rounds, rounds of (coordinate descent on the codes, each moved to its "
                  "least output error with the others held; a refit); 0: none")
      ->check(CLI::Range(0, 8))
      ->needs(gptq)
      ->capture_default_str();
  cmd->add_option("--gptq-fit-damp", o->gptq_fit_damp,
                  "--gptq: the refit and descent rounds minimize d^T (H + D I) d, D this share of H's mean diagonal "
                  "(a ridge on the weight error); 0: H as it is")
      ->check(CLI::Range(0.0, 1.0))
      ->needs(gptq)
      ->capture_default_str();
  cmd->add_flag("--gptq-asymmetric", o->gptq_asymmetric,
                "--gptq: the sequential form fitting each matrix to the unquantized model's outputs from the "
                "quantized model's inputs (GPTAQ's asymmetric calibration; implies --gptq-sequential)")
      ->needs(gptq);
  cmd->add_flag("--gptq-sequential", o->gptq_sequential,
                "--gptq: quantize in the forward's order, each matrix's Hessian from the inputs the already-quantized "
                "matrices before it produce (all calibration windows in one batched CPU forward)")
      ->needs(gptq);
  CLI::Option* gain_fit = cmd->add_flag(
      "--gain-fit", o->gain_fit,
      "--gptq: then fit one gain per input channel of every layer's matrix inputs (folded into the norms and the "
      "rows of v and up) to the unquantized model's outputs");
  gain_fit->needs(gptq);
  cmd->add_option("--gain-fit-ridge", o->gain_fit_ridge,
                  "--gain-fit: the pull of every gain toward 1, a share of the normal matrix's mean diagonal")
      ->check(CLI::Range(0.0, 100.0))
      ->needs(gain_fit)
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd->callback([o] {
    o->head = o->head || !o->head_type.empty();  // --head-type implies --head
    quantize(*o);
  });
}

}  // namespace kiln::cli
