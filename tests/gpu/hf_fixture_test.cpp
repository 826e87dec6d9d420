// The CUDA backend on the Hugging Face fixtures (tests/data/hf, made by transformers with
// python/make_hf_fixtures.py): each real-architecture directory loaded through load_model, run on
// the GPU in bf16 and on the CPU reference with the same weights rounded to bf16, all logits
// compared. The CPU reference itself matches transformers to 2e-5 (golden/hf_transformers_test).
//
// The fixtures live in the source tree; on a GPU machine whose checkout sits elsewhere than the
// build's, set KILN_TEST_DATA_DIR to its tests/data.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "gpu_test_util.h"
#include "model/model_loader.h"

namespace kiln {
namespace {

// bf16 weights with fp32 accumulation against the same rounded weights in fp32 (as in backend_test).
constexpr double kTolLogits = 3e-2;

std::string data_dir() {
  if (const char* d = std::getenv("KILN_TEST_DATA_DIR")) return d;
  return KILN_TEST_DATA;
}

void round_to_bf16(HostMatrix& m) {
  for (float& v : m.data) v = kiln::round_to_bf16(v);
}

void round_weights(ModelWeights& w) {
  for (HostMatrix* m : {&w.embed, &w.final_norm, &w.lm_head}) round_to_bf16(*m);
  for (auto& L : w.layers)
    for (HostMatrix* m : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv, &L.ffn_norm, &L.w_gate,
                          &L.w_up, &L.w_down})
      round_to_bf16(*m);
}

TEST(GpuHfFixtures, LogitsMatchCpuReferenceOnEveryFixture) {
  KILN_REQUIRE_GPU();
  namespace fs = std::filesystem;
  const fs::path root = fs::path(data_dir()) / "hf";
  ASSERT_TRUE(fs::is_directory(root)) << root << " missing; set KILN_TEST_DATA_DIR";
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory() || !fs::exists(entry.path() / "logits.json")) continue;
    SCOPED_TRACE(entry.path().filename().string());
    ThreadPool pool(2);
    LoadedModel m = load_model(entry.path().string(), pool);
    round_weights(m.weights);
    CudaBackend gpu(m.config, m.weights);
    CpuBackend cpu(m.config, std::move(m.weights), pool);
    std::ifstream in(entry.path() / "logits.json");
    auto fixture = nlohmann::json::parse(in);
    for (const auto& c : fixture["cases"]) {
      auto ids = c["ids"].get<std::vector<int32_t>>();
      auto cs = cpu.new_sequence(int64_t(ids.size()));
      auto gs = gpu.new_sequence(int64_t(ids.size()));
      std::vector<float> lc, lg;
      cpu.forward(*cs, ids, true, lc);
      gpu.forward(*gs, ids, true, lg);
      EXPECT_LT(gputest::rel_error(lg, lc), kTolLogits) << ids.size() << " tokens";
    }
    ++checked;
  }
  EXPECT_GE(checked, 6) << "expected the 6+ transformers fixtures";
}

}  // namespace
}  // namespace kiln
