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
// rounds the int4 codes through GPTQ (src/quant/gptq.h) instead of to nearest. --rotate first turns the
// residual stream and the values by random rotations (src/quant/rotation.h; the head becomes untied).
// Byte layouts and metadata keys: docs/QUANTIZATION.md.
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/core.h>

#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "core/dtype.h"
#include "model/gguf/ggml_types.h"
#include "model/gguf/gguf_names.h"
#include "model/gguf/gguf_quant.h"
#include "model/gguf/gguf_writer.h"
#include "quant/quantize.h"
#include "quant/quantize_model.h"
#include "quant/rotation.h"
#include "quantize_options.h"

namespace kiln::cli {
namespace {

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


void quantize(const QuantizeOptions& o) {
  namespace fs = std::filesystem;
  const quant::TargetType target = quant::parse_target_type(o.type);
  KILN_CHECK(o.calib.empty() || target == quant::TargetType::int4, invalid_argument,
             "--calib (the AWQ scale search) applies to --type int4 only");
  KILN_CHECK(!o.gptq || !o.calib.empty(), invalid_argument, "--gptq needs a calibration text (--calib)");
  KILN_CHECK(o.tune_epochs == 0 || target == quant::TargetType::int4, invalid_argument,
             "--tune-epochs tunes int4 grids: it needs --type int4");
  KILN_CHECK(o.tune_epochs == 0 || !o.calib.empty() || !o.tune_text.empty(), invalid_argument,
             "--tune-epochs needs a text to tune on (--tune-text, or --calib)");
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
  // An input whose linear weights are int4 at the target group already keeps its codes with
  // --tune-epochs: only the tuning runs on it, against --tune-teacher.
  const bool input_int4 = all_linear_int4(model.weights, o.group);
  const bool codes_kept = input_int4 && o.tune_epochs > 0;  // an int4 input tuned: its codes and keys hold
  if (o.tune_epochs > 0) {
    KILN_CHECK(!input_int4 || !o.tune_teacher.empty(), invalid_argument,
               "'{}' is int4 already: --tune-epochs needs --tune-teacher, the unquantized model to tune against",
               o.input);
    KILN_CHECK(!input_int4 || (!o.gptq && !o.rotate), invalid_argument,
               "'{}' is int4 already: its codes are kept, so --gptq and --rotate do not apply", o.input);
  }
  if (o.rotate) {
    const auto t0 = std::chrono::steady_clock::now();
    quant::rotate_model(model.config, model.weights, pool, o.rotate_seed);
    fmt::print(stderr, "kiln quantize: residual stream and values rotated (seed {}; norms folded, head untied) in {:.1f} s\n",
               o.rotate_seed, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // The grid tuning's teacher: --tune-teacher, else the model as loaded (rotated: the same function).
  LoadedModel teacher;
  if (o.tune_epochs > 0) {
    if (o.tune_teacher.empty()) {
      teacher.config = model.config;
      teacher.weights = model.weights;
    } else {
      teacher = load_with_progress(o.tune_teacher, pool);
      KILN_CHECK(same_shapes(teacher.config, model.config), invalid_argument,
                 "--tune-teacher '{}' does not have the shapes of '{}'", o.tune_teacher, o.input);
    }
  }
  // --calib's tokens feed the AWQ / GPTQ calibration and, without --tune-text, the tuning; an int4
  // input whose codes are kept and tuned on --tune-text does not read them.
  const bool calib_used = !o.calib.empty() && (!codes_kept || o.tune_text.empty());
  std::vector<int32_t> ids;
  if (calib_used) ids = calibration_ids(o, model, o.calib, o.calib_tokens);
  if (calib_used && !codes_kept) run_awq(o, model, pool, ids);
  if (o.tune_epochs > 0)
    run_tuning(o, model, teacher, pool,
               o.tune_text.empty() ? ids : calibration_ids(o, model, o.tune_text, o.tune_tokens));

  gguf::GgufWriter out;
  for (const auto& [key, value] : in.metadata()) out.set(key, value);
  out.set_string(gguf::kQuantTypeKey, std::string(quant::target_name(target)));
  out.set_u32(gguf::kQuantVersionKey, 1);
  if (!codes_kept) out.set_bool(gguf::kQuantAwqKey, !o.calib.empty() && !o.gptq_no_awq);
  if (o.gptq) out.set_bool(gguf::kQuantGptqKey, true);
  else if (!codes_kept) out.erase(gguf::kQuantGptqKey);
  if (o.tune_epochs > 0) out.set_bool(gguf::kQuantTunedKey, true);
  else out.erase(gguf::kQuantTunedKey);
  if (o.rotate) out.set_bool(gguf::kQuantRotatedKey, true);  // an input's own key is kept: it is still rotated
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
    // The same holds for tuned grids (--tune-epochs), and for an int4 input's codes, kept to be tuned.
    const bool codes_set = (o.gptq || o.tune_epochs > 0) && to == quant::TargetType::int4 && name != kHeadName &&
                           int4_at_group(m, o.group);
    if (!codes_set) quant::quantize_matrix(m, to, o.group);
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
  // A rotated embedding or unquantized head: the input's values no longer apply, so the rotated ones are
  // written in f32 when the input's embedding was f32, else in bf16 (the default model's baseline type).
  const gguf::TensorInfo* in_embed = in.find_tensor(kEmbedName);
  const bool float_f32 = in_embed && in_embed->type == uint32_t(gguf::GgmlType::F32);
  auto write_float = [&](const std::string& name, const std::vector<uint64_t>& ne, const HostMatrix& m) -> uint64_t {
    if (float_f32) {
      out.add_tensor(name, ne, uint32_t(gguf::GgmlType::F32), gguf::f32_bytes(m.data));
      return m.data.size() * 4;
    }
    out.add_tensor(name, ne, uint32_t(gguf::GgmlType::BF16), bf16_bytes(m.data));
    return m.data.size() * 2;
  };
  auto converted_label = [&](const HostMatrix& m) {
    return m.quant.format == QuantFormat::none ? std::string("bf16") : type_label(kiln_type_of(m.quant.format));
  };

  std::map<std::string, HostMatrix*> named = gguf::named_tensors(model.weights);
  // A tied input's head is written as output.weight with --head (a quantized copy of the embedding) and
  // with --rotate (the rotated head, which no longer equals the rotated embedding).
  const bool add_head = (o.head || o.rotate) && !in.find_tensor(kHeadName);
  KILN_CHECK(!add_head || (in_embed && named.count(kEmbedName)), invalid_model,
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
    } else if (m && o.rotate && (t.name == kEmbedName || t.name == kHeadName)) {
      written = write_float(t.name, t.ne, *m);
      fmt::print(stderr, "rotated, size = {:8.2f} MiB ({})\n", mib(written), float_f32 ? "f32" : "bf16");
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
  // The head of a model whose head was the embedding (add_head): output.weight, which the loader then
  // reads as an untied head; without --rotate a copy of the embedding, which itself stays as it was.
  HostMatrix head;  // lives until the write: add_tensor keeps a view of its quantized bytes
  if (add_head) {
    head = o.rotate ? model.weights.lm_head : *named.at(kEmbedName);
    fmt::print(stderr, "[   +/{:4}] {:>36} - {} (tied head), ", n, kHeadName,
               o.rotate ? "rotated apart from the embedding" : "a copy of " + std::string(kEmbedName));
    const uint64_t written = o.head ? write_quantized(kHeadName, in_embed->ne, head)
                                    : write_float(kHeadName, in_embed->ne, head);
    fmt::print(stderr, "{} .. size = {:8.2f} MiB\n",
               o.head ? "converting to " + converted_label(head) : std::string(float_f32 ? "f32" : "bf16"), mib(written));
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
  CLI::Option* rotate = cmd->add_flag(
      "--rotate", o->rotate,
      "First turn the residual stream and each layer's values by random rotations (norms folded into the "
      "matrices, the head untied; the same function in a basis int4 groups fit better)");
  cmd->add_option("--rotate-seed", o->rotate_seed, "--rotate: the rotations' seed")
      ->needs(rotate)
      ->capture_default_str();
  CLI::Option* tune = cmd->add_option(
      "--tune-epochs", o->tune_epochs,
      "int4 with --calib: after the codes are set, tune every group's scale and min end to end (Adam on the KL "
      "divergence from the unquantized model's next-token distributions), this many passes over the windows");
  tune->check(CLI::Range(0, 64))->capture_default_str();
  cmd->add_option("--tune-lr", o->tune_lr, "--tune-epochs: Adam's first step (log-scale; min in grid steps), decaying to 0 on a half cosine")
      ->check(CLI::Range(1e-6, 0.1))
      ->needs(tune)
      ->capture_default_str();
  cmd->add_option("--tune-teacher", o->tune_teacher,
                  "--tune-epochs: the unquantized model to tune against (default: the input as loaded; needed when "
                  "the input is int4 already, whose codes are then kept)")
      ->needs(tune);
  cmd->add_flag("--tune-rows", o->tune_rows,
                "--tune-epochs: tune one gain per row (output channel) instead of every group's scale and min")
      ->needs(tune);
  cmd->add_option("--tune-text", o->tune_text,
                  "--tune-epochs: the text to tune on (default: --calib; the quality script tunes on text GPTQ did not calibrate on)")
      ->needs(tune);
  cmd->add_option("--tune-tokens", o->tune_tokens, "--tune-text: tokens used from its start")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30))
      ->needs(tune)
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd->callback([o] {
    o->head = o->head || !o->head_type.empty();  // --head-type implies --head
    quantize(*o);
  });
}

}  // namespace kiln::cli
