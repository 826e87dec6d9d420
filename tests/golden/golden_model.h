// The default model, loaded once per test binary and shared by the golden tests.
#pragma once

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/model_loader.h"
#include "model_path.h"

namespace kiln::test {

struct GoldenModel {
  ThreadPool pool{0};
  LoadedModel model;
  std::unique_ptr<CpuBackend> backend;
};

// nullptr when the model file is absent (the test then skips or, under CI, fails).
inline GoldenModel* golden_model() {
  static std::unique_ptr<GoldenModel> m = [] {
    std::unique_ptr<GoldenModel> g;
    if (!std::filesystem::exists(default_model_path())) return g;
    g = std::make_unique<GoldenModel>();
    g->model = load_model(default_model_path(), g->pool);
    g->backend = std::make_unique<CpuBackend>(g->model.config, std::move(g->model.weights), g->pool);
    return g;
  }();
  return m.get();
}

inline nlohmann::json load_golden_fixture(const std::string& name) {
  std::ifstream in(std::string(KILN_TEST_DATA) + "/golden/" + name);
  if (!in.good()) throw std::runtime_error("fixture missing: tests/data/golden/" + name);
  return nlohmann::json::parse(in);
}

// Logits of every position of `ids`, in one forward pass.
inline std::vector<float> all_logits(CpuBackend& backend, const std::vector<int32_t>& ids) {
  auto seq = backend.new_sequence(int64_t(ids.size()));
  std::vector<float> logits;
  backend.forward(*seq, ids, true, logits);
  return logits;
}

}  // namespace kiln::test
