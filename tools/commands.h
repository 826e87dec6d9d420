// Each subcommand registers itself on the CLI11 app; its callback runs it.
#pragma once

#include <CLI/CLI.hpp>

namespace kiln::cli {

void add_run_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_tokenize_commands(CLI::App& app);  // tokenize and detokenize

}  // namespace kiln::cli
