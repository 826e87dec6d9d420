// kiln bench: llama-bench-style throughput (pp = prompt processing, tg = token generation) with
// roofline columns: bytes moved per step (weights + KV cache), achieved GB/s and % of the copy
// bandwidth, FLOPs and TFLOP/s. Works on a model file or on random weights of a named real shape
// (--random llama3-8b): speed does not depend on weight values.
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "profile/cost_model.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_buffer.h"
#include "kernels/cuda/attention_decode_trace.h"
#include "kernels/cuda/attention_o_trace.h"
#include "kernels/cuda/quant/qgemv_trace.h"
#endif

namespace kiln::cli {
namespace {

struct BenchOptions {
  ModelOptions m;
  std::string random, json, quant;
  std::string quant_head;
  std::vector<int> n_prompt = {512}, n_gen = {128};
  int reps = 5, depth = 0;
  // Reference figures measured on the H200 (GPU.md, docs/BENCHMARKS.md): cudaMemcpy copy
  // bandwidth (a read-only stream can exceed it slightly) and cuBLAS's bf16 GEMM rate.
  double copy_gbs = 4250, peak_tflops = 700;
  bool per_kernel = false;
};

struct Stats {
  double mean = 0, sd = 0;
};
Stats stats(const std::vector<double>& v) {
  Stats s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / double(v.size() - 1)) : 0;
  return s;
}

// Fills a sequence's cache with `depth` tokens (not timed), 512 at a time.
void fill_to_depth(Backend& backend, KvSequence& seq, int depth, std::vector<float>& logits) {
  std::vector<int32_t> fill(size_t(depth), 1);
  for (size_t p = 0; p < fill.size(); p += 512) {
    size_t n = std::min<size_t>(512, fill.size() - p);
    backend.forward(seq, std::span<const int32_t>(fill.data() + p, n), false, logits);
  }
}

void run(const BenchOptions& o) {
  using clock = std::chrono::steady_clock;
  KILN_CHECK(o.reps >= 1, invalid_argument, "-r/--repetitions must be at least 1, got {}", o.reps);
  KILN_CHECK(o.depth >= 0, invalid_argument, "-d/--depth must be >= 0, got {}", o.depth);
  ThreadPool pool(o.m.threads);
  BenchTarget target = open_bench_target(o.m, o.random, pool, o.quant, o.quant_head);
  std::unique_ptr<Backend>& backend = target.backend;
  apply_kv_cache_option(*backend, o.m);
  const double weight_bytes = target.weight_bytes;
  const std::string& label = target.label;
  const ModelConfig& c = backend->config();
  std::string device_name = backend->name();
  // What the backend stores: the CPU reference keeps everything in fp32.
  profile::Widths widths = backend->name() == "cuda" ? profile::Widths{} : profile::Widths{4, 4, 4, 4};
  widths.proj_weight = target.proj_weight_bytes;  // --quant: the projections' packed bytes
  widths.head_weight = target.head_weight_bytes;  // --quant-head
  // K/V bytes per cached value as the backend stores them (--kv-cache int8|fp8 on CUDA: 1 byte
  // plus a 4-byte scale per head_dim values).
  widths.kv = double(backend->kv_bytes_per_token()) / double(2 * c.n_layers * c.kv_dim());
#ifdef KILN_HAVE_CUDA
  if (device_name == "cuda") device_name = cuda::device_info().name;
#endif
  fmt::print("model: {} | backend: {} | device: {} | weights {:.2f} GB\n", label, backend->name(), device_name,
             weight_bytes / 1e9);
  std::string decode_path;  // how a batch-1 decode step runs on CUDA: the megakernel, or kernels and why
#ifdef KILN_HAVE_CUDA
  if (auto* cb = dynamic_cast<CudaBackend*>(backend.get())) {
    decode_path = cb->uses_megakernel() ? "megakernel" : "kernels (megakernel: " + cb->megakernel_note() + ")";
    fmt::print("decode step: {}\n", decode_path);
  }
#endif
  fmt::print("| {:>8} | {:>16} | {:>9} | {:>8} | {:>6} | {:>9} | {:>8} |\n", "test", "t/s", "ms/step", "GB/s",
             "%copy", "TFLOP/s", "%peak");
  fmt::print("|{:->10}|{:->18}|{:->11}|{:->10}|{:->8}|{:->11}|{:->10}|\n", "", "", "", "", "", "", "");

  const bool on_gpu = backend->name() == "cuda";
  nlohmann::json results = nlohmann::json::array();
  std::vector<float> logits;
  auto report = [&](const std::string& test, const std::vector<double>& seconds, int64_t tokens, int64_t steps,
                    profile::Cost cost_total) {
    std::vector<double> tps;
    for (double s : seconds) tps.push_back(double(tokens) / s);
    Stats t = stats(tps), sec = stats(seconds);
    double gbs = cost_total.bytes / sec.mean / 1e9, tflops = cost_total.flops / sec.mean / 1e12;
    // The % columns compare with the GPU's measured ceilings; the CPU has none measured, so they read 0.
    double pct_bw = on_gpu ? 100 * gbs / o.copy_gbs : 0, pct_peak = on_gpu ? 100 * tflops / o.peak_tflops : 0;
    fmt::print("| {:>8} | {:>9.2f} ± {:<5.2f}| {:>9.3f} | {:>8.1f} | {:>6.1f} | {:>9.2f} | {:>8.1f} |\n", test, t.mean,
               t.sd, sec.mean * 1e3 / double(steps), gbs, pct_bw, tflops, pct_peak);
    results.push_back({{"test", test}, {"tokens_per_s_mean", t.mean}, {"tokens_per_s_sd", t.sd},
                       {"ms_per_step", sec.mean * 1e3 / double(steps)}, {"gb_per_s", gbs},
                       {"pct_copy_bw", pct_bw}, {"tflop_per_s", tflops},
                       {"bytes", cost_total.bytes}, {"flops", cost_total.flops}, {"reps", seconds.size()}});
  };

  for (int np : o.n_prompt) {
    if (np <= 0) continue;
    std::vector<int32_t> prompt(static_cast<size_t>(np));
    for (int i = 0; i < np; ++i) prompt[size_t(i)] = int32_t((i * 7919 + 13) % c.vocab_size);
    std::vector<double> seconds;
    for (int r = 0; r < o.reps + 1; ++r) {  // the first run warms up (graphs, allocations)
      auto seq = backend->new_sequence(o.depth + np + 1);
      fill_to_depth(*backend, *seq, o.depth, logits);
      auto t0 = clock::now();
      backend->forward(*seq, prompt, false, logits);
      double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (r > 0) seconds.push_back(s);
    }
    report(o.depth ? fmt::format("pp{}@d{}", np, o.depth) : fmt::format("pp{}", np), seconds, np, 1,
           profile::step_cost(c, np, o.depth, 1, widths));
  }
  for (int ng : o.n_gen) {
    if (ng <= 0) continue;
    std::vector<double> seconds;
    profile::Cost total;
    for (int64_t i = 0; i < ng; ++i) total += profile::step_cost(c, 1, o.depth + i, 1, widths);
    for (int r = 0; r < o.reps + 1; ++r) {
      auto seq = backend->new_sequence(o.depth + ng + 1);
      int32_t tok = 1;
      fill_to_depth(*backend, *seq, o.depth, logits);
      auto t0 = clock::now();
      // As a decode loop reads them (llama-bench's tg the same): the logits in the backend's own buffer.
      for (int i = 0; i < ng; ++i) backend->forward_last(*seq, std::span<const int32_t>(&tok, 1));
      double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (r > 0) seconds.push_back(s);
    }
    report(o.depth ? fmt::format("tg{}@d{}", ng, o.depth) : fmt::format("tg{}", ng), seconds, ng, ng, total);
#ifdef KILN_HAVE_CUDA
    if (auto* cb = dynamic_cast<CudaBackend*>(backend.get())) fmt::print("{}", cb->megakernel_trace_report());
    fmt::print("{}", cuda::decode_stream_trace_report());  // KILN_ATTN_STREAM_TRACE=1
    fmt::print("{}", cuda::qgemv_trace_report());          // KILN_QGEMV_TRACE=RxC
    fmt::print("{}", cuda::attention_o_trace_report());    // KILN_ATTN_O_TRACE=1
#endif
  }

  nlohmann::json per_kernel = nlohmann::json::array();
#ifdef KILN_HAVE_CUDA
  if (o.per_kernel) {
    auto* cuda = dynamic_cast<CudaBackend*>(backend.get());
    KILN_CHECK(cuda, invalid_argument, "--per-kernel needs the CUDA backend");
    auto profile = [&](const char* what, int64_t n_prompt, int n_decode) {
      auto seq = cuda->new_sequence(o.depth + n_prompt + n_decode + 1);
      std::vector<int32_t> prompt(size_t(o.depth + n_prompt), 1);
      cuda->forward(*seq, prompt, false, logits);
      cuda->reset_kernel_stats();
      cuda->set_profiling(true);
      int32_t tok = 1;
      if (n_decode == 0) {
        auto seq2 = cuda->new_sequence(n_prompt + 1);
        std::vector<int32_t> p2(size_t(n_prompt), 1);
        cuda->forward(*seq2, p2, false, logits);
      }
      for (int i = 0; i < n_decode; ++i) cuda->forward(*seq, std::span<const int32_t>(&tok, 1), false, logits);
      cuda->set_profiling(false);
      int steps = std::max(n_decode, 1);
      auto ks = cuda->kernel_stats();
      double total_ms = 0;
      for (const auto& k : ks) total_ms += k.total_ms;
      fmt::print("\nper-kernel, {} (per step, {} steps timed with CUDA events around each launch):\n", what, steps);
      fmt::print("| {:<26} | {:>6} | {:>9} | {:>6} | {:>10} | {:>12} | {:>8} | {:>6} | {:>8} |\n", "kernel", "calls",
                 "us", "%step", "MB", "GFLOP", "GB/s", "%copy", "TFLOP/s");
      for (const auto& k : ks) {
        double us = k.total_ms * 1e3 / steps, gbs = k.bytes / (k.total_ms * 1e-3) / 1e9,
               tfl = k.flops / (k.total_ms * 1e-3) / 1e12;
        fmt::print("| {:<26} | {:>6} | {:>9.1f} | {:>6.1f} | {:>10.1f} | {:>12.2f} | {:>8.0f} | {:>6.1f} | {:>8.1f} |\n",
                   k.name, k.calls / steps, us, 100 * k.total_ms / total_ms, k.bytes / steps / 1e6,
                   k.flops / steps / 1e9, gbs, 100 * gbs / o.copy_gbs, tfl);
        per_kernel.push_back({{"phase", what}, {"kernel", k.name}, {"calls_per_step", k.calls / steps},
                              {"us_per_step", us}, {"bytes_per_step", k.bytes / steps},
                              {"flops_per_step", k.flops / steps}, {"gb_per_s", gbs}, {"tflop_per_s", tfl}});
      }
      fmt::print("sum of kernels: {:.1f} us per step\n", total_ms * 1e3 / steps);
    };
    profile("decode (batch 1)", 16, 8);
    profile("prefill 512", 512, 0);
  }
#endif

  if (!o.json.empty()) {
    std::ofstream out(o.json);
    KILN_CHECK(out.good(), io, "cannot write '{}'", o.json);
    nlohmann::json j = {{"model", label}, {"backend", backend->name()}, {"device", device_name},
                        {"weight_bytes", weight_bytes}, {"copy_gbs_ceiling", o.copy_gbs},
                        {"peak_tflops_ceiling", o.peak_tflops}, {"depth", o.depth}, {"decode_path", decode_path}, {"results", results},
                        {"per_kernel", per_kernel}};
    out << j.dump(2) << "\n";
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prompt (pp) and generation (tg) throughput with roofline columns");
  add_model_options(cmd, o->m);
  add_kv_cache_option(cmd, o->m);
  cmd->add_option("--random", o->random, "Random bf16 weights of a named shape: llama3-8b, llama2-7b, qwen2.5-7b, mistral-7b, smollm2-135m");
  cmd->add_option("--quant", o->quant, "With --random: the projections as random int8, int4 or fp8 weights (default bf16)");
  cmd->add_option("--quant-head", o->quant_head, "With --random: the output head as random int8, int4 or fp8 weights (default bf16)");
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt lengths (pp tests)")->delimiter(',')->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Generation lengths (tg tests)")->delimiter(',')->capture_default_str();
  cmd->add_option("-d,--depth", o->depth, "Tokens already in the KV cache before each test")->capture_default_str();
  cmd->add_option("-r,--repetitions", o->reps, "Timed repetitions (after one warm-up)")->capture_default_str();
  cmd->add_option("--copy-gbs", o->copy_gbs, "Copy-bandwidth ceiling for the % column")->capture_default_str();
  cmd->add_option("--peak-tflops", o->peak_tflops, "Matrix-rate ceiling for the % column")->capture_default_str();
  cmd->add_flag("--per-kernel", o->per_kernel, "Time every kernel of a decode step and a prefill (CUDA)");
  cmd->add_option("--json", o->json, "Write the results as JSON");
  cmd->callback([o, cmd] {
    if (cmd->get_subcommands().empty()) run(*o);  // `kiln bench throughput` runs its own
  });
  add_bench_throughput_command(*cmd);
}

}  // namespace kiln::cli
