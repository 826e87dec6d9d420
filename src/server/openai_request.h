// Parses and validates the JSON of /v1/completions and /v1/chat/completions into engine requests.
// Every problem is an ApiError (400, OpenAI's shape) naming the field; nothing out of range reaches
// the engine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/engine.h"
#include "tokenizer/chat_format.h"

namespace kiln {
class Tokenizer;
}

namespace kiln::server {

// What the parser needs to know about the served model.
struct ModelInfo {
  const Tokenizer* tokenizer = nullptr;
  std::string chat_template;  // "" when the model has none (chat requests then fail with 400)
  std::string served_name;
  std::string root;  // the model path, as /v1/models' "root"
  int64_t max_model_len = 0;  // prompt + output tokens
  int32_t vocab_size = 0;
  std::vector<int32_t> end_of_generation;
  double bandwidth_ceiling_gbs = 0;  // GPU copy bandwidth for /metrics' utilization (0: none)
};

struct ParsedRequest {
  bool chat = false;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;  // one per prompt of a batched completion; chat: one
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool continuous_usage = false;      // stream_options.continuous_usage_stats (vLLM)
  GenerationRequest base;             // sampling, ignore_eos, stop_token_ids, logprobs
  bool max_tokens_given = false;      // else max_tokens = max_model_len - prompt length
  int64_t max_tokens = 0;
  int64_t max_model_len = 0;         // the served model's, for the default max_tokens
  bool seed_given = false;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool echo = false;                  // completions: prepend the prompt text
  // Logprobs as asked: completions' `logprobs: k`, chat's `logprobs: true` + `top_logprobs: k`.
  bool want_logprobs = false;
  int32_t top_logprobs = 0;

  // The engine request of choice `index` (prompt index * n + sample) with max_tokens resolved.
  GenerationRequest engine_request(size_t index) const;
};

// Both throw ApiError.
ParsedRequest parse_completion_request(const nlohmann::json& body, const ModelInfo& model);
ParsedRequest parse_chat_request(const nlohmann::json& body, const ModelInfo& model);

// Parses a request body as a JSON object (400 for malformed JSON, invalid UTF-8, a non-object).
nlohmann::json parse_json_body(const std::string& body);

// The conversation in `messages` (400 for a malformed one).
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages);
// Renders the chat template and tokenizes (400 when the template rejects the conversation).
std::vector<int32_t> tokenize_chat(const ModelInfo& model, const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt);
// A prompt string as /v1/completions tokenizes it.
std::vector<int32_t> tokenize_prompt(const ModelInfo& model, const std::string& text, bool add_special_tokens);

}  // namespace kiln::server
