// Each subcommand registers itself on the CLI11 app; its callback runs it.
#pragma once

#include <CLI/CLI.hpp>

#include "kiln/engine.h"

namespace kiln::cli {

void add_run_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_bench_throughput_command(CLI::App& bench);  // kiln bench throughput
// The engine knobs every engine command shares (bench throughput, serve).
void add_engine_options(CLI::App* cmd, EngineOptions& options, int64_t& kv_cache_mb);
void add_tokenize_commands(CLI::App& app);  // tokenize and detokenize
void add_profile_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);

}  // namespace kiln::cli
