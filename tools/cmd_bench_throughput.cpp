// kiln bench throughput: offline batch throughput in the manner of `vllm bench throughput`. N
// requests of random prompts (given input/output lengths, optionally varied by a range ratio) are
// submitted to the engine at once; they run to their full output length (ignore_eos), and the
// report gives requests/s, total and output tokens/s, and what the scheduler did (steps, batch
// sizes, KV usage, preemptions).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "kiln/engine.h"

namespace kiln::cli {
namespace {

struct ThroughputOptions {
  ModelOptions m;
  std::string random, json;
  int32_t num_prompts = 64, input_len = 128, output_len = 128;
  double range_ratio = 0;  // lengths drawn from [len * (1 - r), len * (1 + r)], as vLLM's random dataset
  uint64_t seed = 0;
  float temperature = 1.0f;  // vLLM's throughput benchmark samples at temperature 1
  EngineOptions engine;
  int64_t kv_cache_mb = 0;
};

// --max-num-batched-tokens 0 (the default here): vLLM's offline (LLM class) defaults, which
// `vllm bench throughput` runs with: 16384 on a GPU of at least 70 GiB, 8192 on a smaller one; the
// engine's own default (2048) on the CPU. Serving keeps the engine's default, a latency choice.
int64_t default_batched_tokens(const Backend& backend) {
  constexpr int64_t kLargeGpu = int64_t(70) << 30;
  const int64_t device_bytes = backend.device_memory_bytes();
  if (device_bytes == 0) return EngineOptions{}.max_batched_tokens;
  return device_bytes >= kLargeGpu ? 16384 : 8192;
}

void run(ThroughputOptions o) {
  KILN_CHECK(o.num_prompts >= 1 && o.input_len >= 1 && o.output_len >= 1, invalid_argument,
             "--num-prompts, --input-len and --output-len must be positive");
  KILN_CHECK(o.range_ratio >= 0 && o.range_ratio < 1, invalid_argument, "--random-range-ratio must be in [0, 1)");
  ThreadPool pool(o.m.threads);
  BenchTarget target = open_bench_target(o.m, o.random, pool);
  Backend& backend = *target.backend;
  apply_kv_cache_option(backend, o.m);  // before the engine sizes its pool: 8-bit K/V fit ~2x the tokens
  const int64_t vocab = backend.config().vocab_size;
  if (o.kv_cache_mb > 0) o.engine.kv_cache_bytes = o.kv_cache_mb << 20;
  if (o.engine.max_batched_tokens == 0) o.engine.max_batched_tokens = default_batched_tokens(backend);

  std::mt19937_64 rng(o.seed);
  auto draw_len = [&](int32_t len) {
    const int32_t lo = std::max(1, int32_t(len * (1 - o.range_ratio))), hi = std::max(lo, int32_t(len * (1 + o.range_ratio)));
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  std::vector<GenerationRequest> requests(size_t(o.num_prompts));
  int64_t prompt_tokens = 0;
  for (auto& r : requests) {
    r.prompt.resize(size_t(draw_len(o.input_len)));
    for (int32_t& t : r.prompt) t = int32_t(rng() % uint64_t(vocab));
    r.max_tokens = draw_len(o.output_len);
    r.ignore_eos = true;
    r.sampling.temperature = o.temperature;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0;
    r.sampling.seed = rng();
    prompt_tokens += int64_t(r.prompt.size());
  }

  // Every request queued before the first step, as `vllm bench throughput` adds all its prompts
  // before the engine steps: the batching window holds the idle engine until all N have arrived
  // (they come within milliseconds; the cap only guards a stalled submitter). Without it the loop
  // wakes at the first submit and runs a first step of the few prompts queued by then.
  EngineOptions engine_options = o.engine;
  engine_options.batch_wait = std::chrono::milliseconds(1000);
  engine_options.target_batch_size = o.num_prompts;
  engine_options.max_waiting = std::max(engine_options.max_waiting, size_t(o.num_prompts) + 1);
  Engine engine(backend, engine_options);
  const EngineStats before = engine.stats();
  fmt::print("model: {} | backend: {} | KV pool {} blocks x {} tokens | max_num_seqs {} | max_batched_tokens {}{}\n",
             target.label, backend.name(), before.kv_blocks_total, before.block_size, o.engine.max_num_seqs,
             o.engine.max_batched_tokens, o.engine.prefill_first ? " | prefill first" : "");

  std::mutex mutex;
  std::condition_variable all_done;
  int remaining = o.num_prompts, failed = 0;
  std::string first_error;  // what the first failed request said (the run's error names it)
  std::atomic<int64_t> output_tokens{0};
  std::atomic<int32_t> peak_blocks{0}, peak_running{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& r : requests) {
    engine.submit(std::move(r), [&](const GenerationEvent& ev) {
      if (ev.token >= 0) ++output_tokens;
      if (!ev.finished) return;
      std::lock_guard lock(mutex);
      const bool bad = ev.finish_reason == "error" || ev.finish_reason == "cancelled";
      if (bad && first_error.empty()) first_error = ev.error.empty() ? ev.finish_reason : ev.error;
      failed += bad;
      if (--remaining == 0) all_done.notify_all();
    });
  }
  {
    // Sample the engine's state while it runs (peak KV use and batch size).
    std::unique_lock lock(mutex);
    while (!all_done.wait_for(lock, std::chrono::milliseconds(20), [&] { return remaining == 0; })) {
      const EngineStats s = engine.stats();
      peak_blocks = std::max(peak_blocks.load(), s.kv_blocks_used);
      peak_running = std::max(peak_running.load(), s.running);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats s = engine.stats();
  const double out = double(output_tokens.load()), total = out + double(prompt_tokens);
  fmt::print("Throughput: {:.2f} requests/s, {:.2f} total tokens/s, {:.2f} output tokens/s\n",
             o.num_prompts / seconds, total / seconds, out / seconds);
  fmt::print("Total num prompt tokens:  {}\nTotal num output tokens:  {}\nElapsed: {:.3f} s\n", prompt_tokens,
             output_tokens.load(), seconds);
  fmt::print("Engine: {} steps ({:.1f} tokens/step), peak running {}, peak KV use {:.1f}% ({} of {} blocks), "
             "{} preemptions, {} failed\n",
             s.steps_total, double(s.prompt_tokens_total + s.generation_tokens_total) / double(std::max<int64_t>(1, s.steps_total)),
             peak_running.load(), 100.0 * peak_blocks.load() / s.kv_blocks_total, peak_blocks.load(),
             s.kv_blocks_total, s.preemptions_total, failed);
  const double gbs = s.busy_seconds_total > 0 ? s.bytes_total / s.busy_seconds_total / 1e9 : 0;
  fmt::print("Engine: {:.1f} GB/s achieved by the cost model's bytes over step time ({:.1f}% of the steps' wall time "
             "busy)\n",
             gbs, 100 * s.busy_seconds_total / seconds);
  // Host-only time inside steps is time the device idles (forward_batch waits for the device).
  fmt::print("Engine: {:.3f} s in forward passes ({:.1f}% of wall), {:.3f} s of host-only step time ({:.1f}%)\n",
             s.forward_seconds_total, 100 * s.forward_seconds_total / seconds, s.host_seconds_total,
             100 * s.host_seconds_total / seconds);
  KILN_CHECK(failed == 0, internal, "{} requests failed; the first: {}", failed, first_error);
  if (!o.json.empty()) {
    nlohmann::json j = {{"model", target.label},
                        {"backend", backend.name()},
                        {"kv_cache", std::string(kv_cache_format_name(backend.kv_cache_format()))},
                        {"num_prompts", o.num_prompts},
                        {"input_len", o.input_len},
                        {"output_len", o.output_len},
                        {"range_ratio", o.range_ratio},
                        {"max_num_seqs", o.engine.max_num_seqs},
                        {"max_batched_tokens", o.engine.max_batched_tokens},
                        {"prefill_first", o.engine.prefill_first},
                        {"kv_blocks_total", s.kv_blocks_total},
                        {"block_size", s.block_size},
                        {"elapsed_time", seconds},
                        {"requests_per_second", o.num_prompts / seconds},
                        {"tokens_per_second", total / seconds},
                        {"output_tokens_per_second", out / seconds},
                        {"total_prompt_tokens", prompt_tokens},
                        {"total_output_tokens", output_tokens.load()},
                        {"steps", s.steps_total},
                        {"peak_running", peak_running.load()},
                        {"peak_kv_blocks_used", peak_blocks.load()},
                        {"preemptions", s.preemptions_total},
                        {"achieved_gbs", gbs},
                        {"busy_fraction", s.busy_seconds_total / seconds},
                        {"forward_seconds", s.forward_seconds_total},
                        {"host_step_seconds", s.host_seconds_total}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
}

}  // namespace

void add_engine_options(CLI::App* cmd, EngineOptions& e, int64_t& kv_cache_mb) {
  cmd->add_option("--max-num-seqs", e.max_num_seqs, "Most requests in one step")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", e.max_batched_tokens, "Token budget of one step (chunked prefill)")
      ->capture_default_str();
  cmd->add_option("--block-size", e.block_size, "Tokens per KV block")->capture_default_str();
  cmd->add_option("--num-kv-blocks", e.num_kv_blocks, "KV pool size in blocks (0: from the memory budget)");
  cmd->add_option("--kv-cache-memory", kv_cache_mb, "KV pool size in MiB (0: 1 GiB on CPU, --gpu-memory-fraction on GPU)");
  cmd->add_option("--gpu-memory-fraction", e.gpu_memory_fraction, "Share of free GPU memory for the KV pool")
      ->capture_default_str();
  cmd->add_option("--max-model-len", e.max_model_len, "Most tokens per request (0: the model's context)");
  cmd->add_flag("--prefill-first", e.prefill_first,
                "Admit waiting prompts before running decodes (throughput over the running streams' latency)");
}

void add_bench_throughput_command(CLI::App& bench) {
  auto o = std::make_shared<ThroughputOptions>();
  CLI::App* cmd = bench.add_subcommand("throughput", "Offline batch throughput through the engine (vllm bench throughput)");
  add_model_options(cmd, o->m);
  add_kv_cache_option(cmd, o->m);
  cmd->add_option("--random", o->random, "Random bf16 weights of a named shape (GPU), e.g. llama3-8b");
  cmd->add_option("--num-prompts", o->num_prompts, "Requests, all submitted at once")->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "Prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "Generated tokens per request")->capture_default_str();
  cmd->add_option("--random-range-ratio", o->range_ratio, "Vary lengths by up to this fraction")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed for prompts and sampling")->capture_default_str();
  o->engine.max_batched_tokens = 0;  // default_batched_tokens
  add_engine_options(cmd, o->engine, o->kv_cache_mb);
  cmd->get_option("--max-num-batched-tokens")
      ->description("Token budget of one step (0: 16384 on a GPU of >= 70 GiB, 8192 on a smaller one, "
                    "2048 on the CPU)");
  cmd->add_option("--json", o->json, "Write the results as JSON");
  cmd->add_option("--step-trace", o->engine.step_trace_path, "Write one CSV line per engine step (where its time goes)");
  cmd->callback([o] { run(*o); });
}

}  // namespace kiln::cli
