// The kiln command: one binary, one subcommand per job. Only this file decides to exit.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "commands.h"
#include "kiln/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: a C++/CUDA inference engine for Llama-family models"};
  app.require_subcommand(1);
  kiln::cli::add_run_command(app);
  kiln::cli::add_logits_command(app);
  kiln::cli::add_bench_command(app);
  kiln::cli::add_tokenize_commands(app);
  kiln::cli::add_profile_command(app);
  kiln::cli::add_serve_command(app);
  kiln::cli::add_quantize_command(app);
  kiln::cli::add_perplexity_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kiln::Error& e) {
    fmt::print(stderr, "kiln: error ({}): {}\n", kiln::errc_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
