#include "model/model_loader.h"

#include <filesystem>

#include "core/check.h"
#include "model/gguf/gguf_model.h"
#include "model/hf/hf_model.h"

namespace kiln {
namespace {

LoadedModel load_hf(const std::string& path, ThreadPool& pool, bool with_weights) {
  LoadedModel m;
  m.path = path;
  try {
    hf::HfModel h = hf::load_hf_dir(path, pool, with_weights);
    m.config = std::move(h.config);
    m.weights = std::move(h.weights);
    m.eos_token_ids = std::move(h.eos_token_ids);
    m.chat_template = std::move(h.chat_template);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", path, e.what()));
  }
  // tokenizer.json when present; a form kiln cannot read (unsupported) leaves the tokenizer
  // nullptr, and require_tokenizer() then says why. A broken file is an error.
  const std::filesystem::path tokenizer_json = std::filesystem::path(path) / "tokenizer.json";
  if (std::filesystem::is_regular_file(tokenizer_json)) {
    try {
      m.tokenizer = Tokenizer::from_tokenizer_json(tokenizer_json.string(), m.eos_token_ids);
    } catch (const Error& e) {
      if (e.code() != Errc::unsupported) throw Error(e.code(), fmt::format("{}: {}", path, e.what()));
      m.tokenizer_problem = fmt::format("its tokenizer.json: {}", e.what());
    }
    KILN_CHECK(m.tokenizer == nullptr || m.tokenizer->vocab_size() <= m.config.vocab_size, invalid_model,
               "{}: tokenizer.json has {} tokens but the embedding only {} rows", path, m.tokenizer->vocab_size(),
               m.config.vocab_size);
  } else {
    m.tokenizer_problem = "it has no tokenizer.json";
  }
  return m;
}

}  // namespace

const Tokenizer& require_tokenizer(const LoadedModel& model) {
  KILN_CHECK(model.tokenizer != nullptr, unsupported,
             "{}: this model directory has no tokenizer kiln can read yet{}; "
             "pass token ids (e.g. kiln logits --tokens) or use a GGUF of the model",
             model.path, model.tokenizer_problem.empty() ? "" : " (" + model.tokenizer_problem + ")");
  return *model.tokenizer;
}

LoadedModel load_model(const std::string& path, ThreadPool& pool, bool with_weights) {
  namespace fs = std::filesystem;
  KILN_CHECK(fs::exists(path), io, "model '{}' does not exist", path);
  if (fs::is_directory(path)) {
    KILN_CHECK(hf::looks_like_hf_dir(path), invalid_model,
               "'{}' is a directory without config.json; pass a .gguf file or a Hugging Face model directory", path);
    return load_hf(path, pool, with_weights);
  }
  std::string ext = fs::path(path).extension().string();
  KILN_CHECK(ext != ".bin" && ext != ".pt" && ext != ".pth" && ext != ".pkl", unsupported,
             "'{}' looks like a pickle checkpoint; kiln never loads pickles (they can run code). "
             "Convert it to safetensors or GGUF.", path);
  KILN_CHECK(ext != ".safetensors", unsupported,
             "'{}' is a bare safetensors file; pass the Hugging Face directory that holds it and its config.json",
             path);
  auto file = gguf::GgufFile::open(path);
  LoadedModel m;
  m.path = path;
  try {
    m.config = gguf::config_from_gguf(file);
    if (with_weights) m.weights = gguf::weights_from_gguf(file, m.config, pool);
    m.tokenizer = Tokenizer::from_gguf(file);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", path, e.what()));
  }
  m.chat_template = file.get_string("tokenizer.chat_template").value_or("");
  KILN_CHECK(m.tokenizer->vocab_size() <= m.config.vocab_size, invalid_model,
             "{}: the tokenizer has {} tokens but the embedding only {} rows", path, m.tokenizer->vocab_size(),
             m.config.vocab_size);
  if (m.tokenizer->eos_id() >= 0) m.eos_token_ids.push_back(m.tokenizer->eos_id());
  return m;
}

}  // namespace kiln
