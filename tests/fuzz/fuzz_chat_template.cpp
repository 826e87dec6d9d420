// libFuzzer target on kiln's Jinja interpreter (src/tokenizer/jinja) through render_chat: the input
// is a chat template, which comes from the model file (GGUF tokenizer.chat_template or
// tokenizer_config.json) and so is untrusted. Rendering it over a fixed conversation must end in
// text or in kiln::Error (a syntax error, an unsupported construct, raise_exception, a runaway
// loop or value caught by the sandbox's limits); any other exception, a crash, undefined
// behaviour, a hang (scripts/fuzz.sh: 60 s) or an allocation past libFuzzer's limit is a bug.
// Seeds: the real templates of tests/data/chat_templates (scripts/fuzz.sh passes the folder).
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "tokenizer/chat_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<kiln::ChatMessage> conversation = {
      {"system", "Be brief."},
      {"user", "Hi <b>there</b> {{ not a tag }}"},
      {"assistant", "Hello! \xc3\xa9\xf0\x9f\x99\x82"},
      {"user", "And now?"},
  };
  static const kiln::ChatSpecialTokens special{"<s>", "</s>"};
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    // One render an input (the flag from the size's parity): a template that builds a value up to
    // the sandbox's 64 MiB takes ~15 s under the sanitizers, 0.9 s in a release build.
    (void)kiln::render_chat(source, conversation, size % 2 == 0, special);
  } catch (const kiln::Error&) {
  }
  return 0;
}
