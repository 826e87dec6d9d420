// Hugging Face directories: config.json -> ModelConfig (both RoPE forms, llama3 scaling, optional
// head_dim, Qwen2 biases, refusals by name), EOS ids, and whole-directory loading of the tiny
// fixtures (tests/data/hf, python/make_hf_fixtures.py) with config/shape mismatches rejected
// naming the tensor, pickle-only directories refused, and the missing-tokenizer error.
#include <gtest/gtest.h>

#include "expect_error.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "core/thread_pool.h"
#include "kiln/error.h"
#include "model/hf/hf_config.h"
#include "model/hf/hf_model.h"
#include "model/model_loader.h"
#include "model/safetensors/strict_json.h"

namespace kiln::hf {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

json llama() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0, "max_position_embeddings": 2048, "vocab_size": 1001, "tie_word_embeddings": true,
    "hidden_act": "silu", "torch_dtype": "bfloat16", "head_dim": null, "rope_scaling": null })");
}

using test::expect_error;

void expect_config_error(const json& j, const std::string& needle, Errc code = Errc::invalid_model) {
  expect_error([&] { config_from_hf_json(j); }, needle, code);
}

TEST(HfConfig, Llama) {
  ModelConfig c = config_from_hf_json(llama());
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.vocab_size, 1001);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);  // null head_dim -> hidden / heads
  EXPECT_EQ(c.rope.rot_dim, 16);
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope.theta, 100000.0f);
  EXPECT_EQ(c.rope.style, RopeStyle::half);
  EXPECT_EQ(c.rope.llama3_factor, 0.0f);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
}

TEST(HfConfig, DefaultsAndExplicitHeadDim) {
  json j = llama();
  j.erase("num_key_value_heads");
  j.erase("rope_theta");
  j.erase("tie_word_embeddings");
  j.erase("rms_norm_eps");
  j["head_dim"] = 128;
  ModelConfig c = config_from_hf_json(j);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_FLOAT_EQ(c.rope.theta, 10000.0f);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 512);
  EXPECT_EQ(c.rope.rot_dim, 128);
}

TEST(HfConfig, Llama3ScalingInRopeScaling) {
  json j = llama();
  j["rope_scaling"] = json::parse(R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  ModelConfig c = config_from_hf_json(j);
  EXPECT_FLOAT_EQ(c.rope.llama3_factor, 8.0f);
  EXPECT_FLOAT_EQ(c.rope.llama3_low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope.llama3_high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope.llama3_original_context, 8192);
  EXPECT_FLOAT_EQ(c.rope.theta, 100000.0f);
  // Older configs spell it "type".
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  EXPECT_FLOAT_EQ(config_from_hf_json(j).rope.llama3_factor, 8.0f);
  j["rope_scaling"].erase("high_freq_factor");
  expect_config_error(j, "lacks 'high_freq_factor'");
}

TEST(HfConfig, RopeParametersForm) {
  // transformers 5 writes rope_parameters, which carries rope_theta too.
  json j = llama();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = json::parse(R"({"rope_type": "default", "rope_theta": 500000.0})");
  ModelConfig c = config_from_hf_json(j);
  EXPECT_FLOAT_EQ(c.rope.theta, 500000.0f);
  EXPECT_EQ(c.rope.llama3_factor, 0.0f);
  j["rope_parameters"] = json::parse(R"({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  c = config_from_hf_json(j);
  EXPECT_FLOAT_EQ(c.rope.theta, 500000.0f);
  EXPECT_FLOAT_EQ(c.rope.llama3_factor, 32.0f);
  j["rope_parameters"]["rope_type"] = "yarn";
  expect_config_error(j, "rope type 'yarn' is not supported", Errc::unsupported);
  j["rope_parameters"] = 5;
  expect_config_error(j, "'rope_parameters' is 5, not an object");
}

TEST(HfConfig, UnsupportedRopeScaling) {
  json j = llama();
  j["rope_scaling"] = json::parse(R"({"type": "linear", "factor": 2.0})");
  expect_config_error(j, "rope type 'linear'", Errc::unsupported);
  j["rope_scaling"] = json::parse(R"({"rope_type": "dynamic", "factor": 2.0})");
  expect_config_error(j, "rope type 'dynamic'", Errc::unsupported);
}

TEST(HfConfig, Qwen2AndMistral) {
  json q = llama();
  q["architectures"] = {"Qwen2ForCausalLM"};
  q["num_attention_heads"] = 16;
  q["num_key_value_heads"] = 2;
  q["use_sliding_window"] = false;
  q["sliding_window"] = 32768;
  ModelConfig c = config_from_hf_json(q);
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.context_length, 2048);  // the window is off
  q["use_sliding_window"] = true;
  expect_config_error(q, "use_sliding_window", Errc::unsupported);

  json m = llama();
  m["architectures"] = {"MistralForCausalLM"};
  m["sliding_window"] = 1024;
  c = config_from_hf_json(m);
  EXPECT_EQ(c.architecture, "mistral");
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.context_length, 1024);  // full attention is exact only within the window
  m["sliding_window"] = nullptr;
  EXPECT_EQ(config_from_hf_json(m).context_length, 2048);
}

TEST(HfConfig, RefusedByName) {
  json j = llama();
  j["architectures"] = {"GPT2LMHeadModel"};
  expect_config_error(j, "architecture 'GPT2LMHeadModel' is not supported", Errc::unsupported);
  j["architectures"] = json::array();
  expect_config_error(j, "'architectures'");
  j = llama();
  j["hidden_act"] = "gelu";
  expect_config_error(j, "hidden_act \"gelu\"", Errc::unsupported);
  j = llama();
  j["attention_bias"] = true;
  expect_config_error(j, "attention_bias", Errc::unsupported);
  j = llama();
  j["mlp_bias"] = true;
  expect_config_error(j, "mlp_bias", Errc::unsupported);
}

TEST(HfConfig, MissingAndMistypedFields) {
  json j = llama();
  j.erase("intermediate_size");
  expect_config_error(j, "lacks 'intermediate_size'");
  j = llama();
  j["hidden_size"] = "64";
  expect_config_error(j, "'hidden_size' is \"64\", not an integer");
  j = llama();
  j["tie_word_embeddings"] = 1;
  expect_config_error(j, "'tie_word_embeddings' is 1, not true/false");
  j = llama();
  j["num_key_value_heads"] = 3;
  expect_config_error(j, "not a multiple of 3 kv heads");
  j = llama();
  j["num_attention_heads"] = 0;
  expect_config_error(j, "num_attention_heads is 0");
  expect_config_error(json::array(), "not an object");
}

TEST(HfConfig, EosIds) {
  EXPECT_EQ(eos_ids_from_json(json::parse(R"({"eos_token_id": 2})"), 10, "g"), (std::vector<int32_t>{2}));
  EXPECT_EQ(eos_ids_from_json(json::parse(R"({"eos_token_id": [2, 9]})"), 10, "g"), (std::vector<int32_t>{2, 9}));
  EXPECT_TRUE(eos_ids_from_json(json::parse(R"({"eos_token_id": null})"), 10, "g").empty());
  EXPECT_TRUE(eos_ids_from_json(json::parse(R"({})"), 10, "g").empty());
  expect_error([] { eos_ids_from_json(json::parse(R"({"eos_token_id": 10})"), 10, "g"); }, "outside the vocabulary",
               Errc::invalid_model);
  expect_error([] { eos_ids_from_json(json::parse(R"({"eos_token_id": ["2"]})"), 10, "g"); }, "not an integer",
               Errc::invalid_model);
}

TEST(HfConfig, DuplicateKeysInConfigRefused) {
  expect_error([] { parse_strict_json(R"({"hidden_size": 64, "hidden_size": 128})", "config.json"); },
               "key 'hidden_size' twice", Errc::invalid_model);
}

// ---- whole directories ------------------------------------------------------------------------

std::string fixture(const std::string& name) { return std::string(KILN_TEST_DATA) + "/hf/" + name; }

struct TempCopy {
  fs::path path;
  explicit TempCopy(const std::string& name) {
    path = fs::temp_directory_path() /
           ("kiln_hf_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" + name +
            "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
    if (!name.empty()) fs::copy(fixture(name), path, fs::copy_options::recursive);
  }
  ~TempCopy() { fs::remove_all(path); }
  json config() const { return read_strict_json_file((path / "config.json").string()); }
  void set_config(const json& j) const { std::ofstream(path / "config.json") << j.dump(2); }
  void touch(const std::string& name, const std::string& text = "x") const { std::ofstream(path / name) << text; }
};

TEST(HfDirectory, LoadsFixtureWithEosAndNoTokenizer) {
  LoadedModel m = load_model(fixture("llama_tied_v1001"), pool());
  EXPECT_EQ(m.config.architecture, "llama");
  EXPECT_EQ(m.config.vocab_size, 1001);
  EXPECT_TRUE(m.config.tied_embeddings);
  EXPECT_TRUE(m.weights.lm_head.empty());
  EXPECT_EQ(m.weights.layers.size(), 2u);
  EXPECT_EQ(m.eos_token_ids, (std::vector<int32_t>{0, 1000}));
  EXPECT_EQ(m.tokenizer, nullptr);
  expect_error([&] { require_tokenizer(m); }, "no tokenizer kiln can read yet (it has no tokenizer.json)",
               Errc::unsupported);
}

TEST(HfDirectory, ShardedQwenAndBf16) {
  LoadedModel m = load_model(fixture("mistral_mha_hd80"), pool());  // two shards + index
  EXPECT_EQ(m.config.architecture, "mistral");
  EXPECT_EQ(m.config.head_dim, 80);
  EXPECT_EQ(m.eos_token_ids, (std::vector<int32_t>{2, 3}));
  LoadedModel q = load_model(fixture("qwen2_gqa7_bias"), pool());
  EXPECT_TRUE(q.config.qkv_bias);
  EXPECT_EQ(q.weights.layers[1].bq.cols, q.config.q_dim());
  EXPECT_EQ(q.weights.layers[1].bk.cols, q.config.kv_dim());
  LoadedModel b = load_model(fixture("llama_bf16"), pool());
  EXPECT_EQ(b.eos_token_ids, (std::vector<int32_t>{2}));
}

void expect_dir_error(const TempCopy& d, const std::string& needle, Errc code = Errc::invalid_model) {
  expect_error([&] { load_model(d.path.string(), pool()); }, needle, code);
}

TEST(HfDirectory, ConfigShapeMismatchNamesTheTensor) {
  TempCopy d("llama_hd128");
  json good = d.config();
  json j = good;
  j["intermediate_size"] = 65;
  d.set_config(j);
  expect_dir_error(d, "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [64, 64] but config.json implies [65, 64]");
  j = good;
  j["vocab_size"] = 129;
  d.set_config(j);
  expect_dir_error(d, "tensor 'model.embed_tokens.weight' has shape [128, 64]");
  j = good;
  j["head_dim"] = 64;
  d.set_config(j);
  expect_dir_error(d, "tensor 'model.layers.0.self_attn.q_proj.weight'");
  j = good;
  j["num_hidden_layers"] = 3;
  d.set_config(j);
  expect_dir_error(d, "lack tensor 'model.layers.2.input_layernorm.weight'");
  j = good;
  j["num_hidden_layers"] = 1;
  d.set_config(j);
  expect_dir_error(d, "num_hidden_layers is 1");
  j = good;
  j["architectures"] = {"Qwen2ForCausalLM"};  // qwen2 expects q/k/v biases the file lacks
  d.set_config(j);
  expect_dir_error(d, "lack tensor 'model.layers.0.self_attn.q_proj.bias'");
  j = good;
  j["tie_word_embeddings"] = true;  // tied: lm_head in the file is ignored, as transformers does
  d.set_config(j);
  EXPECT_TRUE(load_model(d.path.string(), pool()).weights.lm_head.empty());
}

TEST(HfDirectory, PickleOnlyDirectoryRefused) {
  TempCopy d("llama_hd128");
  fs::remove(d.path / "model.safetensors");
  d.touch("pytorch_model.bin");
  expect_dir_error(d, "holds only pickle checkpoints (pytorch_model.bin); kiln never loads pickles", Errc::unsupported);
  expect_error([&] { load_model((d.path / "pytorch_model.bin").string(), pool()); }, "pickle", Errc::unsupported);
  fs::remove(d.path / "pytorch_model.bin");
  expect_dir_error(d, "no model.safetensors or model.safetensors.index.json");
  d.touch("adapter.safetensors");
  expect_dir_error(d, "adapter.safetensors");
}

TEST(HfDirectory, OtherRefusals) {
  TempCopy empty("");
  expect_dir_error(empty, "without config.json");
  TempCopy d("llama_hd128");
  d.touch("config.json", "{\"a\": 1,}");
  expect_dir_error(d, "not valid JSON");
  expect_error([&] { load_model((d.path / "model.safetensors").string(), pool()); }, "bare safetensors file",
               Errc::unsupported);
}

}  // namespace
}  // namespace kiln::hf
