#include "model/model_loader.h"

#include <filesystem>

#include "core/check.h"
#include "model/gguf/gguf_model.h"

namespace kiln {

LoadedModel load_model(const std::string& path, ThreadPool& pool) {
  namespace fs = std::filesystem;
  KILN_CHECK(fs::exists(path), io, "model '{}' does not exist", path);
  if (fs::is_directory(path))
    KILN_FAIL(unsupported, "'{}' is a directory; Hugging Face directories are not supported yet, pass a .gguf file",
              path);
  std::string ext = fs::path(path).extension().string();
  KILN_CHECK(ext != ".bin" && ext != ".pt" && ext != ".pth" && ext != ".pkl", unsupported,
             "'{}' looks like a pickle checkpoint; kiln never loads pickles (they can run code). "
             "Convert it to safetensors or GGUF.", path);
  auto file = gguf::GgufFile::open(path);
  LoadedModel m;
  m.path = path;
  try {
    m.config = gguf::config_from_gguf(file);
    m.weights = gguf::weights_from_gguf(file, m.config, pool);
    m.tokenizer = Tokenizer::from_gguf(file);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", path, e.what()));
  }
  m.chat_template = file.get_string("tokenizer.chat_template").value_or("");
  KILN_CHECK(m.tokenizer->vocab_size() <= m.config.vocab_size, invalid_model,
             "{}: the tokenizer has {} tokens but the embedding only {} rows", path, m.tokenizer->vocab_size(),
             m.config.vocab_size);
  return m;
}

}  // namespace kiln
