// Helpers shared by the kiln subcommands: finding the model, loading it with progress, and
// building the backend the user asked for.
#pragma once

#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "core/text_file.h"  // read_text_file, which the commands use
#include "core/thread_pool.h"
#include "model/model_loader.h"

namespace kiln::cli {

// What every subcommand that loads a model takes: -m, --device, -t.
struct ModelOptions {
  std::string model;
  std::string device = "auto";
  int32_t threads = 0;
  std::string kv_cache;  // --kv-cache (commands that add it): bf16, int8, fp8; empty: the backend's own
  int64_t ubatch = 2048;  // --ubatch: tokens per GPU forward pass of one sequence's prompt (CUDA)
};
void add_model_options(CLI::App* cmd, ModelOptions& options);
// --kv-cache bf16|int8|fp8 (run, serve, bench, bench throughput, perplexity, profile).
void add_kv_cache_option(CLI::App* cmd, ModelOptions& options);
// Sets the backend's KV cache format from --kv-cache (nothing when it was not given). bf16 is the
// CUDA backend's own cache; a format a backend cannot store yet is kiln::Error(unsupported).
void apply_kv_cache_option(Backend& backend, const ModelOptions& options);

// The -m argument, or the default model (SmolLM2-135M-Instruct Q4_1) fetched by scripts/fetch_model.sh.
std::string resolve_model_path(const std::string& arg);

// Loads the model, printing what it does and how long it took to stderr.
LoadedModel load_with_progress(const std::string& path, ThreadPool& pool);

// "cpu" or "cuda" ("auto": cuda when this build has it and a GPU is present).
// The backend of --device (and --ubatch for CUDA); the model's weights move into it.
std::unique_ptr<Backend> make_backend(const ModelOptions& options, LoadedModel& model, ThreadPool& pool);

// The whole of a stream (files: core/text_file.h's read_text_file).
std::string read_all(std::istream& in);

// The chat template to use: --chat-template's value (a file path, else the Jinja text itself)
// when given, else the model's own; kiln::Error(invalid_argument) when there is neither.
std::string choose_chat_template(const std::string& override_arg, const std::string& model_template);

// What a benchmark runs on: a model file, or random bf16 weights of a named real shape on the GPU
// (--random llama3-8b: speed does not depend on weight values).
struct BenchTarget {
  std::unique_ptr<Backend> backend;
  std::optional<LoadedModel> model;  // when from a file
  std::string label;
  double weight_bytes = 0;
  double proj_weight_bytes = 0;  // bytes per weight of the quantized projections (--quant), 0: dense
  double head_weight_bytes = 0;  // the same for the output head (--quant-head), 0: dense
};
// random_quant (with random_shape): "", "bf16", "int8", "int4" or "fp8" for the layers' projections;
// head_quant: the same for the output head ("" or "bf16": bf16; llama.cpp's Q8_0 files have an
// 8-bit head, its Q4_0 files a 6-bit one).
BenchTarget open_bench_target(const ModelOptions& options, const std::string& random_shape, ThreadPool& pool,
                              const std::string& random_quant = "", const std::string& head_quant = "");

// Token ids written as "1,2,3", "1 2 3" or "[1, 2, 3]"; kiln::Error(invalid_argument) naming
// `what` for anything else.
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& what);

}  // namespace kiln::cli
