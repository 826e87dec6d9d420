// libFuzzer target on a Hugging Face directory's config.json (src/model/hf/hf_config.h): the strict
// JSON reader, then the typed ModelConfig and the end-of-sequence ids. Any input must give a valid
// config or throw kiln::Error (invalid_model for a malformed or mistyped file, unsupported for an
// architecture kiln does not run); an nlohmann exception escaping would be a bug.
// Seeds: the config.json files of tests/data/hf (scripts/fuzz.sh copies them).
#include <cstdint>
#include <string_view>

#include "kiln/error.h"
#include "model/hf/hf_config.h"
#include "model/safetensors/strict_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const nlohmann::json j =
        kiln::parse_strict_json(std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
    const kiln::ModelConfig c = kiln::hf::config_from_hf_json(j);
    (void)kiln::hf::eos_ids_from_json(j, c.vocab_size, "config.json");
  } catch (const kiln::Error&) {
  }
  return 0;
}
