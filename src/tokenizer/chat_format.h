// Turns a conversation into prompt text. Until the Jinja interpreter lands, kiln recognizes the
// ChatML family of templates (SmolLM2, Qwen2) by their markers and renders them directly,
// including the default system prompt the template inserts when the conversation has none.
#pragma once

#include <string>
#include <vector>

namespace kiln {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// Throws kiln::Error(unsupported) for templates it does not recognize, naming the way out.
std::string render_chat(const std::string& chat_template, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt);

}  // namespace kiln
