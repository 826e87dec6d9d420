// kiln's CPU forward on tiny Hugging Face directories against transformers' own logits
// (python/make_hf_fixtures.py: random weights, float32, eager attention, the saved directory
// reloaded). Covers GQA 1/4/7, head dims 8/32/64/80/128 (incl. head_dim != hidden/heads), Qwen2
// q/k/v biases, llama3 RoPE scaling at positions past original_max_position_embeddings, a
// vocabulary of 1001 with tied embeddings, BF16 weights and sharded safetensors; and the GGUF
// conversion of one fixture (Q/K rows permuted as llama.cpp does) against the same directory.
//
// Tolerance: both sides compute the same function in fp32 from the same weights (BF16 ones
// upcast exactly on both sides), so the only difference is summation order (kiln's per-row dot
// products vs. PyTorch's blocked GEMMs, softmax and RMSNorm reductions). Each op adds a relative
// error of order sqrt(K) * 2^-24 ~ 1e-6 for K <= 256, and two layers compound a handful of
// them. Measured (2026-11-30, transformers 5.24, torch 2.15, 2 threads): at most 2.6e-6 on
// logits up to |x| ~ 4, and 1.75e-5 on the tied vocab-1001 fixture whose logits reach |x| ~ 49;
// at most 8e-7 relative to each fixture's largest logit. Bounds: 1e-4 absolute and 1e-5
// relative to the largest logit, 6-12x above the worst measured, while a wrong RoPE pairing, a
// missing bias or unscaled llama3 frequencies move logits by 1e-1..1 (checked: turning the
// llama3 scaling off gives 1.4). Argmax must match at every position; the fixtures keep the
// top-2 gap above 2e-3, 20x the absolute bound, so a tie cannot flip it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/gguf/gguf_model.h"
#include "model/model_loader.h"

namespace kiln {
namespace {

constexpr double kTolerance = 1e-4;     // absolute, on logits
constexpr double kRelTolerance = 1e-5;  // relative to the fixture's largest |logit|

std::string hf_dir(const std::string& name) { return std::string(KILN_TEST_DATA) + "/hf/" + name; }

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

std::vector<float> decode_b64_f32(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    int v = val(c);
    if (v < 0) continue;  // '=' padding
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(uint8_t(acc >> bits));
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::vector<float> all_logits(CpuBackend& backend, const std::vector<int32_t>& ids) {
  auto seq = backend.new_sequence(int64_t(ids.size()));
  std::vector<float> logits;
  backend.forward(*seq, ids, true, logits);
  return logits;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) throw std::runtime_error("fixture missing: " + path + " (python/make_hf_fixtures.py)");
  return nlohmann::json::parse(in);
}

class HfTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTransformers, LogitsMatchTransformers) {
  const std::string name = GetParam();
  LoadedModel m = load_model(hf_dir(name), pool());
  CpuBackend backend(m.config, std::move(m.weights), pool());
  const nlohmann::json fx = read_json(hf_dir(name) + "/logits.json");
  const size_t vocab = size_t(m.config.vocab_size);
  ASSERT_EQ(fx["vocab_size"].get<size_t>(), vocab);
  double worst = 0, worst_rel = 0;
  for (const auto& c : fx["cases"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(::testing::Message() << name << ", " << ids.size() << " tokens");
    std::vector<float> expected = decode_b64_f32(c["logits_f32_b64"].get<std::string>());
    ASSERT_EQ(expected.size(), ids.size() * vocab);
    std::vector<float> got = all_logits(backend, ids);
    ASSERT_EQ(got.size(), expected.size());
    auto argmax = c["argmax"].get<std::vector<int32_t>>();
    double max_abs = c["max_abs_logit"].get<double>();
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* row = got.data() + t * vocab;
      int32_t best = int32_t(std::max_element(row, row + vocab) - row);
      EXPECT_EQ(best, argmax[t]) << "position " << t;
      for (size_t v = 0; v < vocab; ++v) {
        double d = std::fabs(double(row[v]) - double(expected[t * vocab + v]));
        worst = std::max(worst, d);
        worst_rel = std::max(worst_rel, d / std::max(1.0, max_abs));
      }
    }
  }
  std::printf("%s: max |kiln - transformers| = %.2e (%.2e of the largest logit)\n", name.c_str(), worst, worst_rel);
  EXPECT_LE(worst, kTolerance);
  EXPECT_LE(worst_rel, kRelTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTransformers,
                         ::testing::Values("llama_gqa4", "mistral_mha_hd80", "qwen2_gqa7_bias", "llama3_rope_scaling",
                                           "llama_hd128", "llama_tied_v1001", "llama_bf16"),
                         [](const auto& info) { return info.param; });

// The GGUF made from llama_gqa4 (permuted Q/K, interleaved RoPE) computes the same logits as the
// HF directory (HF halves). Same weights, same op order in kiln: only the RoPE pairing and the
// row order of Q/K differ, so the results agree to rounding (bounded like above).
TEST(HfGguf, ConvertedGgufMatchesDirectory) {
  LoadedModel hf = load_model(hf_dir("llama_gqa4"), pool());
  LoadedModel gg = load_model(hf_dir("llama_gqa4.gguf"), pool());
  EXPECT_EQ(gg.config.rope.style, RopeStyle::interleaved);
  EXPECT_EQ(hf.config.rope.style, RopeStyle::half);
  EXPECT_EQ(gg.config.head_dim, hf.config.head_dim);
  EXPECT_EQ(gg.config.n_kv_heads, hf.config.n_kv_heads);
  ASSERT_NE(gg.tokenizer, nullptr);
  CpuBackend a(hf.config, std::move(hf.weights), pool());
  CpuBackend b(gg.config, std::move(gg.weights), pool());
  const nlohmann::json fx = read_json(hf_dir("llama_gqa4") + "/logits.json");
  double worst = 0;
  for (const auto& c : fx["cases"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    std::vector<float> x = all_logits(a, ids), y = all_logits(b, ids);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(double(x[i]) - double(y[i])));
  }
  std::printf("max |gguf - hf dir| = %.2e\n", worst);
  EXPECT_LE(worst, kTolerance);
}

}  // namespace
}  // namespace kiln
