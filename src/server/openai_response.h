// The JSON kiln answers with: completion and chat responses, their streamed chunks, usage and
// logprobs, in the shapes the OpenAI API (and vLLM) use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/choice_state.h"

namespace kiln::server {

struct ResponseMeta {
  bool chat = false;
  std::string id;  // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;
  std::string model;
};

ResponseMeta make_meta(bool chat, const std::string& model);

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// Logprobs of `items`: chat {"content": [...]} or completions' {tokens, token_logprobs, ...}.
nlohmann::json logprobs_json(bool chat, const Tokenizer& tokenizer, const std::vector<LogprobItem>& items,
                             size_t text_offset_base = 0);

// One streamed chunk for choice `index`. role: the chat's first chunk ({"role": "assistant"}).
// finish_reason: "" while running.
nlohmann::json chunk_json(const ResponseMeta& meta, int32_t index, const std::string& text,
                          const nlohmann::json& logprobs, const std::string& finish_reason, bool role,
                          const nlohmann::json& stop_reason = nullptr);
// The chunk after the last one when include_usage: "choices": [] and the usage.
nlohmann::json usage_chunk_json(const ResponseMeta& meta, const nlohmann::json& usage);

// The non-streamed response. prompt_texts: for echo (completions), else empty.
nlohmann::json response_json(const ResponseMeta& meta, const Tokenizer& tokenizer, const std::vector<ChoiceState>& choices,
                             const std::vector<std::string>& echo_prefixes, bool logprobs, const nlohmann::json& usage);

// `data: {json}\n\n`, invalid UTF-8 (never expected) replaced rather than thrown.
std::string sse_event(const nlohmann::json& j);
std::string dump_json(const nlohmann::json& j);

// vLLM's stop_reason: the stop string or stop token id that ended a choice, else null.
nlohmann::json stop_reason_json(const ChoiceState& c, int32_t last_token, const std::vector<int32_t>& stop_token_ids);

}  // namespace kiln::server
