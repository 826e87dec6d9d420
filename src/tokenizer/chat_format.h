// Turns a conversation into prompt text by rendering the model's chat template (Jinja, from
// tokenizer.chat_template or tokenizer_config.json) with kiln's Jinja interpreter, exactly as
// Hugging Face transformers' apply_chat_template(..., tokenize=False) renders it.
#pragma once

#include <string>
#include <vector>

namespace kiln {

class Tokenizer;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// The special-token strings templates splice in as `bos_token` and `eos_token`.
struct ChatSpecialTokens {
  std::string bos;
  std::string eos;
};

// The tokenizer's BOS and EOS texts ("" where it has none).
ChatSpecialTokens chat_special_tokens(const Tokenizer& tokenizer);

// Renders `messages` with the template. The template sees what transformers passes: messages
// (dicts with role and content), add_generation_prompt, bos_token, eos_token, and tools and
// documents set to none. Throws kiln::Error: invalid_argument when the template rejects the
// conversation (its raise_exception message is included, e.g. roles that do not alternate) or
// is malformed; unsupported for Jinja features kiln does not implement.
std::string render_chat(const std::string& chat_template, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, const ChatSpecialTokens& special_tokens);

// As above with empty BOS/EOS strings.
std::string render_chat(const std::string& chat_template, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt);

}  // namespace kiln
