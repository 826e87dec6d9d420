#include "tokenizer/chat_format.h"

#include "core/check.h"

namespace kiln {

// The text between "<|im_start|>system\n" and the next "<|im_end|>" in the template source: the
// system prompt a ChatML template adds when the conversation starts with another role.
static std::string chatml_default_system(const std::string& tmpl) {
  const std::string open = "<|im_start|>system\n";
  size_t start = tmpl.find(open);
  if (start == std::string::npos) return {};
  start += open.size();
  size_t end = tmpl.find("<|im_end|>", start);
  if (end == std::string::npos) return {};
  std::string text = tmpl.substr(start, end - start);
  // Templates that splice a variable here ({{ ... }}) have no fixed default.
  return text.find("{{") == std::string::npos && text.find("{%") == std::string::npos ? text : std::string();
}

std::string render_chat(const std::string& tmpl, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  KILN_CHECK(tmpl.find("<|im_start|>") != std::string::npos, unsupported,
             "this model's chat template is not ChatML and kiln cannot render other templates yet; "
             "run without --chat and write the prompt in the model's format");
  std::string out;
  std::string default_system = chatml_default_system(tmpl);
  if (!default_system.empty() && (messages.empty() || messages[0].role != "system"))
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace kiln
