#include "model/hf/hf_model.h"

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.h"
#include "core/text_file.h"
#include "model/hf/hf_config.h"
#include "model/layer_tensors.h"
#include "model/safetensors/strict_json.h"

namespace kiln::hf {
namespace fs = std::filesystem;
namespace {

// Reads tensor `name`, which must have shape [rows, cols] (or [cols] when rows == 1), into fp32.
HostMatrix read_matrix(const safetensors::TensorSet& ts, const std::string& name, int64_t rows, int64_t cols,
                       ThreadPool& pool) {
  const safetensors::TensorInfo* t = ts.find(name);
  KILN_CHECK(t != nullptr, invalid_model, "the safetensors lack tensor '{}'", name);
  bool matches = rows == 1 ? (t->shape.size() == 1 && int64_t(t->shape[0]) == cols)
                           : (t->shape.size() == 2 && int64_t(t->shape[0]) == rows && int64_t(t->shape[1]) == cols);
  KILN_CHECK(matches, invalid_model, "tensor '{}' has shape {} but config.json implies [{}{}]", name,
             t->shape_string(), rows == 1 ? "" : fmt::format("{}, ", rows), cols);
  KILN_CHECK(t->dtype == safetensors::DType::F32 || t->dtype == safetensors::DType::F16 ||
                 t->dtype == safetensors::DType::BF16,
             unsupported, "tensor '{}' has dtype {}; kiln loads F32, F16 and BF16 weights", name,
             safetensors::dtype_name(t->dtype));
  HostMatrix m(rows, cols);
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    safetensors::to_f32(*t, m.data.data() + r0 * cols, uint64_t(r0 * cols), uint64_t((r1 - r0) * cols));
  });
  return m;
}

bool is_pickle(const fs::path& p) {
  std::string ext = p.extension().string();
  return ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".pkl";
}

std::string read_chat_template(const fs::path& dir) {
  fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) return read_text_file(jinja.string(), "chat template");
  fs::path tc = dir / "tokenizer_config.json";
  if (!fs::exists(tc)) return "";
  nlohmann::json j = read_strict_json_file(tc.string());
  auto it = j.is_object() ? j.find("chat_template") : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

bool looks_like_hf_dir(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / "config.json"); }

safetensors::TensorSet open_weights(const std::string& dir) {
  fs::path d(dir);
  if (fs::exists(d / "model.safetensors")) return safetensors::TensorSet::open_file((d / "model.safetensors").string());
  if (fs::exists(d / "model.safetensors.index.json"))
    return safetensors::TensorSet::open_index((d / "model.safetensors.index.json").string());
  std::vector<std::string> pickles, others;
  for (const auto& e : fs::directory_iterator(d)) {
    if (!e.is_regular_file()) continue;
    if (is_pickle(e.path())) pickles.push_back(e.path().filename().string());
    if (e.path().extension() == ".safetensors") others.push_back(e.path().filename().string());
  }
  std::sort(pickles.begin(), pickles.end());
  KILN_CHECK(pickles.empty(), unsupported,
             "'{}' holds only pickle checkpoints ({}); kiln never loads pickles, because unpickling can run "
             "arbitrary code. Convert the model to safetensors (e.g. transformers' save_pretrained(..., "
             "safe_serialization=True)) or to GGUF.",
             dir, fmt::join(pickles, ", "));
  KILN_CHECK(others.empty(), invalid_model,
             "'{}' has {} but neither model.safetensors nor model.safetensors.index.json; kiln needs one of those", dir,
             fmt::join(others, ", "));
  KILN_FAIL(invalid_model, "'{}' has a config.json but no model.safetensors or model.safetensors.index.json", dir);
}

ModelWeights weights_from_tensors(const safetensors::TensorSet& ts, const ModelConfig& c, ThreadPool& pool) {
  ModelWeights w;
  w.embed = read_matrix(ts, "model.embed_tokens.weight", c.vocab_size, c.hidden_size, pool);
  w.final_norm = read_matrix(ts, "model.norm.weight", 1, c.hidden_size, pool);
  // Tied: transformers ties lm_head to the embedding even when the file also stores lm_head.
  if (!c.tied_embeddings) w.lm_head = read_matrix(ts, "lm_head.weight", c.vocab_size, c.hidden_size, pool);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers.emplace_back();
    for (const LayerTensor& t : kLayerTensors)
      if (t.in(c))
        L.*t.field = read_matrix(ts, fmt::format("model.layers.{}.{}", l, t.hf), t.n_rows(c), t.n_cols(c), pool);
  }
  // A layer beyond num_hidden_layers means config.json and the weights describe different models.
  KILN_CHECK(ts.find(fmt::format("model.layers.{}.input_layernorm.weight", c.n_layers)) == nullptr, invalid_model,
             "the safetensors hold tensor 'model.layers.{}.input_layernorm.weight' but config.json says "
             "num_hidden_layers is {}",
             c.n_layers, c.n_layers);
  return w;
}

HfModel load_hf_dir(const std::string& dir, ThreadPool& pool, bool with_weights) {
  fs::path d(dir);
  KILN_CHECK(looks_like_hf_dir(dir), invalid_model, "'{}' has no config.json; is it a Hugging Face model directory?",
             dir);
  nlohmann::json cfg = read_strict_json_file((d / "config.json").string());
  HfModel m;
  m.config = config_from_hf_json(cfg);
  if (m.config.name.empty()) m.config.name = d.filename().empty() ? d.parent_path().filename().string()
                                                                 : d.filename().string();
  if (with_weights) {
    safetensors::TensorSet tensors = open_weights(dir);
    m.weights = weights_from_tensors(tensors, m.config, pool);
  }
  fs::path gen = d / "generation_config.json";
  if (fs::exists(gen))
    m.eos_token_ids = eos_ids_from_json(read_strict_json_file(gen.string()), m.config.vocab_size,
                                        "generation_config.json");
  if (m.eos_token_ids.empty()) m.eos_token_ids = eos_ids_from_json(cfg, m.config.vocab_size, "config.json");
  m.chat_template = read_chat_template(d);
  return m;
}

}  // namespace kiln::hf
