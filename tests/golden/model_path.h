// Where the golden tests find the default model: $KILN_MODEL, else the repo's models/ folder.
// Missing model: skip on a developer machine, fail under CI (where setup.sh must have fetched it).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kiln::test {

inline std::string default_model_path() {
  if (const char* p = std::getenv("KILN_MODEL")) return p;
  return std::string(KILN_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

#define KILN_REQUIRE_MODEL(path)                                                                  \
  do {                                                                                            \
    if (!std::filesystem::exists(path)) {                                                         \
      if (std::getenv("CI")) FAIL() << "default model missing under CI: " << (path);              \
      GTEST_SKIP() << "default model not found at " << (path) << "; run scripts/fetch_model.sh"; \
    }                                                                                             \
  } while (0)

}  // namespace kiln::test
