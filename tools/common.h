// Helpers shared by the kiln subcommands: finding the model, loading it with progress, and
// building the backend the user asked for.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/model_loader.h"

namespace kiln::cli {

// What every subcommand that loads a model takes: -m, --device, -t.
struct ModelOptions {
  std::string model;
  std::string device = "auto";
  int32_t threads = 0;
};
void add_model_options(CLI::App* cmd, ModelOptions& options);

// The -m argument, or the default model (SmolLM2-135M-Instruct Q4_1) fetched by scripts/fetch_model.sh.
std::string resolve_model_path(const std::string& arg);

// Loads the model, printing what it does and how long it took to stderr.
LoadedModel load_with_progress(const std::string& path, ThreadPool& pool);

// "cpu" or "cuda" ("auto": cuda when this build has it and a GPU is present).
std::unique_ptr<Backend> make_backend(const std::string& device, LoadedModel& model, ThreadPool& pool);

}  // namespace kiln::cli
