#include "server/openai_response.h"

#include <atomic>
#include <chrono>
#include <random>

#include <fmt/format.h>

namespace kiln::server {

using nlohmann::json;

ResponseMeta make_meta(bool chat, const std::string& model) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  ResponseMeta m;
  m.chat = chat;
  m.id = fmt::format("{}-{:016x}{:08x}", chat ? "chatcmpl" : "cmpl", salt, counter.fetch_add(1) & 0xffffffffu);
  m.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.model = model;
  return m;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {
json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}
}  // namespace

json logprobs_json(bool chat, const Tokenizer& tok, const std::vector<LogprobItem>& items, size_t text_offset_base) {
  if (chat) {
    json content = json::array();
    for (const LogprobItem& it : items) {
      std::string raw = tok.token_bytes(it.token);
      json top = json::array();
      for (const TokenLogprob& t : it.top) {
        std::string traw = tok.token_bytes(t.token);
        top.push_back({{"token", token_text(tok, t.token)}, {"logprob", t.logprob}, {"bytes", bytes_of(traw)}});
      }
      content.push_back({{"token", token_text(tok, it.token)},
                         {"logprob", it.logprob},
                         {"bytes", bytes_of(raw)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const LogprobItem& it : items) {
    tokens.push_back(token_text(tok, it.token));
    token_logprobs.push_back(it.logprob);
    json t = json::object();
    for (const TokenLogprob& x : it.top) t[token_text(tok, x.token)] = x.logprob;
    top.push_back(std::move(t));
    offsets.push_back(text_offset_base + it.text_offset);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

json chunk_json(const ResponseMeta& meta, int32_t index, const std::string& text, const json& logprobs,
                const std::string& finish_reason, bool role, const json& stop_reason) {
  json choice;
  choice["index"] = index;
  if (meta.chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (!finish_reason.empty()) choice["stop_reason"] = stop_reason;
  return {{"id", meta.id},
          {"object", meta.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array({std::move(choice)})}};
}

json usage_chunk_json(const ResponseMeta& meta, const json& usage) {
  return {{"id", meta.id},
          {"object", meta.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array()},
          {"usage", usage}};
}

json response_json(const ResponseMeta& meta, const Tokenizer& tok, const std::vector<ChoiceState>& choices,
                   const std::vector<std::string>& echo_prefixes, bool logprobs, const json& usage) {
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = choices[i];
    std::string prefix = i < echo_prefixes.size() ? echo_prefixes[i] : "";
    json lp = logprobs ? logprobs_json(meta.chat, tok, c.logprobs(), prefix.size()) : json(nullptr);
    json choice;
    choice["index"] = i;
    if (meta.chat)
      choice["message"] = {{"role", "assistant"}, {"content", c.text()}};
    else
      choice["text"] = prefix + c.text();
    choice["logprobs"] = std::move(lp);
    choice["finish_reason"] = c.finish_reason();
    choice["stop_reason"] = c.stopped_by_string() ? json(c.matched_stop()) : json(nullptr);
    out_choices.push_back(std::move(choice));
  }
  return {{"id", meta.id},
          {"object", meta.chat ? "chat.completion" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(out_choices)},
          {"usage", usage}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

json stop_reason_json(const ChoiceState& c, int32_t last_token, const std::vector<int32_t>& stop_token_ids) {
  if (c.stopped_by_string()) return c.matched_stop();
  for (int32_t id : stop_token_ids)
    if (id == last_token) return id;
  return nullptr;
}

}  // namespace kiln::server
