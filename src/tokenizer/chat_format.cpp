#include "tokenizer/chat_format.h"

#include "core/check.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

ChatSpecialTokens chat_special_tokens(const Tokenizer& tokenizer) {
  ChatSpecialTokens t;
  if (tokenizer.bos_id() >= 0) t.bos = tokenizer.token_bytes(tokenizer.bos_id());
  if (tokenizer.eos_id() >= 0) t.eos = tokenizer.token_bytes(tokenizer.eos_id());
  return t;
}

std::string render_chat(const std::string& chat_template, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, const ChatSpecialTokens& special_tokens) {
  KILN_CHECK(!chat_template.empty(), unsupported,
             "this model has no chat template; run without --chat and write the prompt in the model's format");
  using jinja::Value;
  std::vector<Value> message_values;
  for (const ChatMessage& m : messages) {
    Value message = Value::dict();
    message.as_dict().set("role", m.role);
    message.as_dict().set("content", m.content);
    message_values.push_back(std::move(message));
  }
  // The variables transformers' render_jinja_template passes (tools=None, documents=None included:
  // templates test "tools is not none").
  const std::map<std::string, Value> variables = {
      {"messages", Value::list(std::move(message_values))},
      {"add_generation_prompt", add_generation_prompt},
      {"bos_token", special_tokens.bos},
      {"eos_token", special_tokens.eos},
      {"tools", jinja::None{}},
      {"documents", jinja::None{}},
  };
  return jinja::Template(chat_template).render(variables);
}

std::string render_chat(const std::string& chat_template, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
  return render_chat(chat_template, messages, add_generation_prompt, ChatSpecialTokens{});
}

}  // namespace kiln
