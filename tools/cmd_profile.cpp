// kiln profile: where each microsecond of a step goes. Runs a few decode steps of a batch at a
// given context (or one prefill) on the CUDA backend, first untouched to measure the step time,
// then with every launch timed (CUPTI's kernel records where libcupti loads, else CUDA events
// around each launch); prints a table per kernel (calls, time, % of step,
// bytes and FLOPs from the cost model, GB/s, TFLOP/s, % of the measured ceilings, memory- or
// compute-bound by arithmetic intensity), and writes JSON and an SVG roofline chart.
// --calibrate measures the ceilings (copy bandwidth, bf16 tensor-core rate) and caches them.
#include <algorithm>
#include <chrono>
#include <fstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "profile/chrome_trace.h"
#include "profile/roofline_svg.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/ceilings.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_buffer.h"
#endif

namespace kiln::cli {
namespace {

struct ProfileOptions {
  ModelOptions m;
  std::string random, json, svg, trace, quant;
  std::string quant_head;
  int batch = 1, context = 512, prefill = 0, steps = 10;
  int prompts = 0, prompt_len = 128;  // a mixed step: prompts prefilled alongside the decode batch
  bool calibrate = false;
};

#ifdef KILN_HAVE_CUDA
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What a profiled workload looks like to the profiler: run one step (or prefill) synchronously.
struct Workload {
  std::string name;
  std::function<void()> step;
};

// Decode of `batch` sequences at `context` cached tokens each, over a paged pool; with prompts,
// also that many prompt sequences of prompt_len tokens, prefilled from position 0 in every step
// (the engine's admission step: chunks admitted next to the running sequences' decode rows).
struct DecodeBatch {
  std::unique_ptr<KvPool> pool;
  std::vector<std::vector<int32_t>> tables, prompt_tables;
  std::vector<int64_t> positions;
  std::vector<float> logits;
  std::vector<int32_t> argmax;
};

std::shared_ptr<DecodeBatch> make_decode(Backend& backend, int batch, int context, int max_steps, int prompts = 0,
                                         int prompt_len = 0) {
  auto d = std::make_shared<DecodeBatch>();
  const int32_t bs = 16;
  const int64_t per_seq = (int64_t(context) + max_steps + bs - 1) / bs, per_prompt = (int64_t(prompt_len) + bs - 1) / bs;
  d->pool = backend.new_kv_pool(int32_t(per_seq * batch + per_prompt * prompts), bs);
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> table(static_cast<size_t>(per_seq));
    for (int64_t i = 0; i < per_seq; ++i) table[size_t(i)] = int32_t(b * per_seq + i);
    d->tables.push_back(std::move(table));
  }
  for (int p = 0; p < prompts; ++p) {
    std::vector<int32_t> table(static_cast<size_t>(per_prompt));
    for (int64_t i = 0; i < per_prompt; ++i) table[size_t(i)] = int32_t(per_seq * batch + p * per_prompt + i);
    d->prompt_tables.push_back(std::move(table));
  }
  // Fill the cache: 2048 tokens per step, a chunk of up to 512 per sequence.
  std::vector<int32_t> ones(512, 1);
  d->positions.assign(size_t(batch), 0);
  for (;;) {
    std::vector<BatchEntry> entries;
    int64_t budget = 2048;
    for (int b = 0; b < batch && budget > 0; ++b) {
      const int64_t left = context - d->positions[size_t(b)];
      if (left <= 0) continue;
      const int64_t n = std::min<int64_t>({left, 512, budget});
      entries.push_back({std::span<const int32_t>(ones.data(), size_t(n)), d->positions[size_t(b)], d->tables[size_t(b)], false});
      d->positions[size_t(b)] += n;
      budget -= n;
    }
    if (entries.empty()) break;
    backend.forward_batch(*d->pool, entries, d->logits);
  }
  return d;
}

void run_profile(const ProfileOptions& o) {
  if (o.calibrate) {
    fmt::print("kiln: measuring the ceilings of {} ...\n", cuda::device_info().name);
    const cuda::Ceilings c = cuda::measure_ceilings();
    cuda::save_cached_ceilings(c);
    fmt::print("copy bandwidth {:.0f} GB/s (cudaMemcpy D2D, read + write), bf16 tensor cores {:.0f} TFLOP/s "
               "(cuBLAS 8192^3); cached in {}\n",
               c.copy_gbs, c.bf16_tflops, cuda::ceilings_cache_path());
    if (o.random.empty() && o.m.model.empty()) return;
  }
  KILN_CHECK(o.batch >= 1 && o.context >= 1 && o.steps >= 1 && o.prefill >= 0, invalid_argument,
             "-b, -c and --steps must be positive, --prefill >= 0");
  KILN_CHECK(o.prompts >= 0 && o.prompt_len >= 2 && !(o.prompts > 0 && o.prefill > 0), invalid_argument,
             "--prompts must be >= 0 and --prompt-len >= 2, and --prompts does not combine with --prefill");
  ThreadPool pool(o.m.threads);
  BenchTarget target = open_bench_target(o.m, o.random, pool, o.quant, o.quant_head);
  auto* cuda_backend = dynamic_cast<CudaBackend*>(target.backend.get());
  KILN_CHECK(cuda_backend != nullptr, unsupported, "kiln profile times GPU kernels: it needs --device cuda");
  CudaBackend& backend = *cuda_backend;
  apply_kv_cache_option(backend, o.m);  // --kv-cache int8|fp8: the 8-bit cache's kernels in the table
  const cuda::Ceilings roof = cuda::current_ceilings();

  Workload work;
  std::shared_ptr<DecodeBatch> decode;
  std::unique_ptr<KvSequence> seq;
  std::vector<int32_t> prompt(size_t(std::max(o.prefill, 1)), 1);
  std::vector<float> logits;
  if (o.prefill > 0) {
    work.name = fmt::format("prefill {} tokens", o.prefill);
    seq = backend.new_sequence(o.prefill + 1);
    work.step = [&] {
      seq->truncate(0);
      backend.forward(*seq, prompt, false, logits);
    };
  } else {
    work.name = fmt::format("decode, batch {} at context {}", o.batch, o.context);
    if (o.prompts > 0) work.name += fmt::format(", and {} prompts of {} tokens prefilled", o.prompts, o.prompt_len);
    // Steps run below: 1 + (1 + steps) with graphs + (1 + steps) without + min(steps, 3) profiled.
    decode = make_decode(backend, o.batch, o.context, 2 * o.steps + 6, o.prompts, o.prompt_len);
    prompt.assign(size_t(o.prompt_len), 1);
    work.step = [&] {
      std::vector<BatchEntry> entries;
      static const int32_t token = 1;
      // As the engine runs greedy requests: the argmax on the device, no logits copied back.
      for (int b = 0; b < o.batch; ++b)
        entries.push_back({std::span<const int32_t>(&token, 1), decode->positions[size_t(b)], decode->tables[size_t(b)],
                           true, true});
      // The prompts' whole chunks, the last row's logits wanted (its first token), as the engine admits them.
      for (int p = 0; p < o.prompts; ++p)
        entries.push_back({std::span<const int32_t>(prompt), 0, decode->prompt_tables[size_t(p)], true, true});
      backend.forward_batch(*decode->pool, entries, decode->logits, &decode->argmax);
      for (auto& p : decode->positions) ++p;
    };
  }

  // 1. The step as it normally runs (graphs where the backend uses them), median wall time; then
  // without CUDA graphs, to show how much of any gap is launch overhead the graphs save.
  auto median_step_ms = [&] {
    work.step();
    std::vector<double> ms;
    for (int i = 0; i < o.steps; ++i) {
      cuda::cuda_synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      work.step();
      cuda::cuda_synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(ms);
  };
  work.step();
  const double step = median_step_ms();
  backend.set_use_graphs(false);
  const double eager = median_step_ms();
  backend.set_use_graphs(true);
  // 2. The same steps with every launch timed.
  const int profiled = std::min(o.steps, 3);
  backend.reset_kernel_stats();
  backend.set_profiling(true);
  if (!o.trace.empty() && !backend.profiling_has_kernel_records()) {
    backend.set_profiling(false);
    KILN_FAIL(unsupported, "--trace needs CUPTI's kernel records; this run would time with {}",
              backend.profiling_timer());
  }
  for (int i = 0; i < profiled; ++i) work.step();
  backend.set_profiling(false);
  const std::vector<KernelStat> ks = backend.kernel_stats();

  const double ridge = roof.bf16_tflops * 1000 / roof.copy_gbs;  // FLOP per byte where the roofs meet
  fmt::print("{} | {} | {}\n", target.label, work.name, roof.gpu);
  fmt::print("kernels timed by {}\n", backend.profiling_timer());
  fmt::print("ceilings: {:.0f} GB/s, {:.0f} TFLOP/s ({}); ridge at {:.0f} FLOP/byte\n", roof.copy_gbs,
             roof.bf16_tflops, roof.measured ? "measured by kiln profile --calibrate" : "assumed: GPU.md's H200 figures",
             ridge);
  fmt::print("| {:<24} | {:>5} | {:>9} | {:>6} | {:>9} | {:>9} | {:>7} | {:>7} | {:>6} | {:<7} |\n", "kernel", "calls",
             "us/step", "%step", "MB", "GFLOP", "GB/s", "TFLOP/s", "%roof", "bound");
  double sum_ms = 0;
  nlohmann::json rows = nlohmann::json::array();
  std::vector<profile::RooflinePoint> points;
  for (const KernelStat& k : ks) sum_ms += k.total_ms;
  for (const KernelStat& k : ks) {
    const double s = k.total_ms * 1e-3, gbs = k.bytes / s / 1e9, tflops = k.flops / s / 1e12;
    const double intensity = k.bytes > 0 ? k.flops / k.bytes : 0;
    const bool memory_bound = intensity < ridge;
    const double pct = memory_bound ? 100 * gbs / roof.copy_gbs : 100 * tflops / roof.bf16_tflops;
    fmt::print("| {:<24} | {:>5} | {:>9.1f} | {:>6.1f} | {:>9.2f} | {:>9.3f} | {:>7.0f} | {:>7.1f} | {:>6.1f} | {:<7} |\n",
               k.name, k.calls / profiled, k.total_ms * 1e3 / profiled, 100 * k.total_ms / sum_ms,
               k.bytes / profiled / 1e6, k.flops / profiled / 1e9, gbs, tflops, pct, memory_bound ? "memory" : "compute");
    rows.push_back({{"kernel", k.name}, {"calls_per_step", k.calls / profiled}, {"us_per_step", k.total_ms * 1e3 / profiled},
                    {"pct_of_step", 100 * k.total_ms / sum_ms}, {"bytes_per_step", k.bytes / profiled},
                    {"flops_per_step", k.flops / profiled}, {"gb_per_s", gbs}, {"tflop_per_s", tflops},
                    {"flop_per_byte", intensity}, {"pct_of_roof", pct}, {"bound", memory_bound ? "memory" : "compute"}});
    points.push_back({k.name, intensity, tflops});
  }
  const double kernels_ms = sum_ms / profiled;
  int64_t launches = 0;
  double idle_ms = 0;
  for (const KernelStat& k : ks) {
    launches += k.calls;
    idle_ms += k.idle_ms;
  }
  launches /= profiled;
  idle_ms /= profiled;
  fmt::print("sum of kernels {:.3f} ms per step vs {:.3f} ms per step measured without profiling: "
             "{:+.1f}% ({} launches; the step without CUDA graphs takes {:.3f} ms)\n",
             kernels_ms, step, 100 * (kernels_ms - step) / step, launches, eager);
  if (idle_ms > 0)
    fmt::print("of which GPU idle between kernels (launch gaps, charged to the kernel after each): {:.3f} ms "
               "({:.1f}% of the kernels' sum)\n",
               idle_ms, 100 * idle_ms / kernels_ms);
  if (!o.json.empty()) {
    nlohmann::json j = {{"model", target.label},     {"workload", work.name},   {"gpu", roof.gpu},
                        {"copy_gbs", roof.copy_gbs}, {"bf16_tflops", roof.bf16_tflops},
                        {"ceilings_measured", roof.measured},
                        {"batch", o.batch},          {"context", o.context},     {"prefill", o.prefill},
                        {"prompts", o.prompts},      {"prompt_len", o.prompt_len},
                        {"step_ms", step},           {"step_ms_without_graphs", eager},
                        {"launches_per_step", launches}, {"kernels_ms", kernels_ms}, {"idle_ms", idle_ms},
                        {"timer", backend.profiling_timer()}, {"kernels", rows}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  if (!o.trace.empty()) {
    const std::vector<profile::TraceEvent> events = backend.last_step_trace();
    std::ofstream out(o.trace);
    out << profile::chrome_trace_json(events, fmt::format("{}: {} ({})", target.label, work.name, roof.gpu));
    KILN_CHECK(out.good(), io, "could not write the trace to {}", o.trace);
    fmt::print("timeline of the last profiled step: {} ({} kernels; ui.perfetto.dev or chrome://tracing opens it)\n",
               o.trace, events.size());
  }
  if (!o.svg.empty()) {
    std::ofstream(o.svg) << profile::roofline_svg(fmt::format("{}: {} ({})", target.label, work.name, roof.gpu),
                                                  roof.copy_gbs, roof.bf16_tflops, points);
    fmt::print("roofline chart: {}\n", o.svg);
  }
}
#endif

void run(const ProfileOptions& o) {
#ifdef KILN_HAVE_CUDA
  KILN_CHECK(cuda::cuda_device_count() > 0, unsupported, "kiln profile times GPU kernels and no CUDA device is visible");
  run_profile(o);
#else
  (void)o;
  KILN_FAIL(unsupported, "kiln profile times GPU kernels; this build has no CUDA backend");
#endif
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  CLI::App* cmd = app.add_subcommand("profile", "Per-kernel time, bytes, FLOPs and roofline position of a step (GPU)");
  add_model_options(cmd, o->m);
  add_kv_cache_option(cmd, o->m);
  cmd->add_option("--random", o->random, "Random bf16 weights of a named shape, e.g. llama3-8b");
  cmd->add_option("--quant", o->quant, "With --random: the projections as random int8, int4 or fp8 weights (default bf16)");
  cmd->add_option("--quant-head", o->quant_head, "With --random: the output head as random int8, int4 or fp8 weights (default bf16)");
  cmd->add_option("-b,--batch", o->batch, "Sequences decoding together")->capture_default_str();
  cmd->add_option("-c,--context", o->context, "Tokens already cached per sequence")->capture_default_str();
  cmd->add_option("--prefill", o->prefill, "Profile one prefill of this many tokens instead of decode");
  cmd->add_option("--prompts", o->prompts,
                  "With decode: also prefill this many prompts in every step (an admission step of continuous batching)");
  cmd->add_option("--prompt-len", o->prompt_len, "Tokens of each --prompts prompt")->capture_default_str();
  cmd->add_option("--steps", o->steps, "Steps timed without profiling (median)")->capture_default_str();
  cmd->add_flag("--calibrate", o->calibrate, "Measure the GPU's copy bandwidth and tensor-core rate and cache them");
  cmd->add_option("--json", o->json, "Write the table as JSON");
  cmd->add_option("--svg", o->svg, "Write a roofline chart (SVG)");
  cmd->add_option("--trace", o->trace,
                  "Write the last profiled step's kernels as a timeline (Chrome trace JSON, for ui.perfetto.dev)");
  cmd->callback([o] { run(*o); });
}

}  // namespace kiln::cli
