#include "server/openai_request.h"

#include <cmath>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "kiln/error.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {
namespace {

using nlohmann::json;

constexpr int32_t kMaxN = 128;            // choices per request
constexpr size_t kMaxChoices = 256;       // prompts x n
constexpr int32_t kMaxLogprobs = 20;
constexpr size_t kMaxStops = 16;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return v.is_number_integer() ? "integer" : "number";
  }
}

// A field that is absent or null counts as not given, as in the OpenAI API.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t get_int(const json& v, const char* name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw bad_request(fmt::format("'{}' must be an integer, got {}", name, type_name(v)), name);
  bool in_range;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    in_range = u <= uint64_t(hi) && int64_t(u) >= lo;
    x = in_range ? int64_t(u) : 0;
  } else {
    x = v.get<int64_t>();
    in_range = x >= lo && x <= hi;
  }
  if (!in_range) throw bad_request(fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, v.dump()), name);
  return x;
}

double get_number(const json& v, const char* name, double lo, double hi, bool lo_open = false) {
  if (!v.is_number()) throw bad_request(fmt::format("'{}' must be a number, got {}", name, type_name(v)), name);
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    throw bad_request(fmt::format("'{}' must be in {}{}, {}], got {}", name, lo_open ? "(" : "[", lo, hi, v.dump()),
                      name);
  return x;
}

bool get_bool(const json& v, const char* name) {
  if (!v.is_boolean()) throw bad_request(fmt::format("'{}' must be a boolean, got {}", name, type_name(v)), name);
  return v.get<bool>();
}

std::vector<int32_t> get_token_ids(const json& v, const char* name, int32_t vocab) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& t : v) {
    if (!t.is_number_integer())
      throw bad_request(fmt::format("'{}' must hold integer token ids, got {}", name, type_name(t)), name);
    bool ok = t.is_number_unsigned() ? t.get<uint64_t>() < uint64_t(vocab) : (t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab);
    if (!ok) throw bad_request(fmt::format("token id {} in '{}' is outside the vocabulary [0, {})", t.dump(), name, vocab), name);
    ids.push_back(t.get<int32_t>());
  }
  return ids;
}

void check_model(const json& body, const ModelInfo& model, ParsedRequest& r) {
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) throw bad_request("'model' must be a string", "model");
    r.model = m->get<std::string>();
    if (r.model != model.served_name)
      throw ApiError(404, "NotFoundError", fmt::format("The model `{}` does not exist.", r.model), "model",
                     "model_not_found");
  }
  r.model = model.served_name;
}

// Fields shared by both endpoints.
void parse_common(const json& body, const ModelInfo& model, ParsedRequest& r) {
  check_model(body, model, r);
  SamplingParams& s = r.base.sampling;
  // OpenAI's defaults (vLLM's without a generation config): plain sampling at temperature 1.
  s.temperature = 1.0f;
  s.top_k = 0;
  s.top_p = 1.0f;
  s.min_p = 0.0f;
  s.penalty_last_n = 0;
  if (const json* v = field(body, "temperature")) s.temperature = float(get_number(*v, "temperature", 0, 100));
  if (const json* v = field(body, "top_p")) s.top_p = float(get_number(*v, "top_p", 0, 1, true));
  if (const json* v = field(body, "top_k")) {
    int64_t k = get_int(*v, "top_k", -1, std::numeric_limits<int32_t>::max());
    s.top_k = k < 0 ? 0 : int32_t(k);
  }
  if (const json* v = field(body, "min_p")) s.min_p = float(get_number(*v, "min_p", 0, 1));
  if (const json* v = field(body, "presence_penalty")) s.presence_penalty = float(get_number(*v, "presence_penalty", -2, 2));
  if (const json* v = field(body, "frequency_penalty"))
    s.frequency_penalty = float(get_number(*v, "frequency_penalty", -2, 2));
  if (const json* v = field(body, "repetition_penalty"))
    s.repetition_penalty = float(get_number(*v, "repetition_penalty", 0, 100, true));
  if (const json* v = field(body, "seed")) {
    s.seed = uint64_t(get_int(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    r.seed_given = true;
  } else {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    s.seed = rng();
  }
  if (const json* v = field(body, "n")) r.n = int32_t(get_int(*v, "n", 1, kMaxN));
  if (const json* v = field(body, "max_tokens")) {
    r.max_tokens = get_int(*v, "max_tokens", 1, std::numeric_limits<int32_t>::max());
    r.max_tokens_given = true;
  }
  if (const json* v = field(body, "max_completion_tokens")) {
    r.max_tokens = get_int(*v, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max());
    r.max_tokens_given = true;
  }
  if (const json* v = field(body, "stream")) r.stream = get_bool(*v, "stream");
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    if (const json* u = field(*v, "include_usage")) r.include_usage = get_bool(*u, "stream_options.include_usage");
    if (const json* u = field(*v, "continuous_usage_stats"))
      r.continuous_usage = get_bool(*u, "stream_options.continuous_usage_stats");
  }
  if (const json* v = field(body, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > kMaxStops) throw bad_request(fmt::format("'stop' holds at most {} strings", kMaxStops), "stop");
      for (const json& s : *v) {
        if (!s.is_string()) throw bad_request("'stop' must be a string or an array of strings", "stop");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      throw bad_request("'stop' must be a string or an array of strings", "stop");
    }
    for (const std::string& s : r.stop)
      if (s.empty()) throw bad_request("'stop' strings must not be empty", "stop");
  }
  if (const json* v = field(body, "stop_token_ids")) {
    if (!v->is_array()) throw bad_request("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    r.base.stop_token_ids = get_token_ids(*v, "stop_token_ids", model.vocab_size);
  }
  if (const json* v = field(body, "ignore_eos")) r.base.ignore_eos = get_bool(*v, "ignore_eos");
  if (const json* v = field(body, "include_stop_str_in_output"))
    r.include_stop_str_in_output = get_bool(*v, "include_stop_str_in_output");
  try {
    s.validate();
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
}

void finish_common(ParsedRequest& r, const ModelInfo& model) {
  r.max_model_len = model.max_model_len;
  if (r.prompts.size() * size_t(r.n) > kMaxChoices)
    throw bad_request(fmt::format("{} prompts x n = {} asks for {} choices; at most {} per request", r.prompts.size(),
                                  r.n, r.prompts.size() * size_t(r.n), kMaxChoices),
                      "n");
  for (const auto& p : r.prompts) {
    if (p.empty()) throw bad_request("the prompt is empty", r.chat ? "messages" : "prompt");
    int64_t len = int64_t(p.size());
    if (len >= model.max_model_len)
      throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} "
                                    "tokens; reduce the length of the {}.",
                                    model.max_model_len, len, r.chat ? "messages" : "prompt"),
                        r.chat ? "messages" : "prompt", "context_length_exceeded");
    if (r.max_tokens_given && len + r.max_tokens > model.max_model_len)
      throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                    "tokens ({} in the {}, {} in the completion). Please reduce the length of the "
                                    "{} or the completion.",
                                    model.max_model_len, len + r.max_tokens, len, r.chat ? "messages" : "prompt",
                                    r.max_tokens, r.chat ? "messages" : "prompt"),
                        "max_tokens", "context_length_exceeded");
  }
}

}  // namespace

json parse_json_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past a double (1e400)
    throw bad_request(fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw bad_request("the request body must be a JSON object");
  return j;
}

std::vector<ChatMessage> parse_messages(const json& messages) {
  if (!messages.is_array() || messages.empty())
    throw bad_request("'messages' must be a non-empty array of messages", "messages");
  std::vector<ChatMessage> out;
  for (const json& m : messages) {
    if (!m.is_object()) throw bad_request("each message must be an object with 'role' and 'content'", "messages");
    const json* role = field(m, "role");
    if (!role || !role->is_string()) throw bad_request("each message needs a string 'role'", "messages");
    ChatMessage msg{role->get<std::string>(), ""};
    if (const json* c = field(m, "content")) {
      if (c->is_string()) {
        msg.content = c->get<std::string>();
      } else if (c->is_array()) {  // content parts: only text is supported
        for (const json& part : *c) {
          const json* type = part.is_object() ? field(part, "type") : nullptr;
          const json* text = part.is_object() ? field(part, "text") : nullptr;
          if (!type || *type != "text" || !text || !text->is_string())
            throw bad_request("message content parts must be {\"type\": \"text\", \"text\": ...}", "messages");
          msg.content += text->get<std::string>();
        }
      } else {
        throw bad_request("message 'content' must be a string or an array of text parts", "messages");
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<int32_t> tokenize_chat(const ModelInfo& model, const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt) {
  if (model.chat_template.empty())
    throw bad_request("this model has no chat template; use /v1/completions", "messages");
  std::string text;
  try {
    text = render_chat(model.chat_template, messages, add_generation_prompt, chat_special_tokens(*model.tokenizer));
  } catch (const Error& e) {
    throw bad_request(fmt::format("the chat template rejected the conversation: {}", e.what()), "messages");
  }
  return model.tokenizer->encode(text, false, true);  // the rendered text already holds any BOS
}

std::vector<int32_t> tokenize_prompt(const ModelInfo& model, const std::string& text, bool add_special_tokens) {
  return model.tokenizer->encode(text, add_special_tokens && model.tokenizer->add_bos_default(), true);
}

ParsedRequest parse_completion_request(const json& body, const ModelInfo& model) {
  ParsedRequest r;
  r.chat = false;
  parse_common(body, model, r);
  const json* p = field(body, "prompt");
  if (!p) throw bad_request("'prompt' is required", "prompt");
  auto all_of = [](const json& a, bool (json::*pred)() const noexcept) {
    for (const json& x : a)
      if (!(x.*pred)()) return false;
    return true;
  };
  if (p->is_string()) {
    r.prompts.push_back(tokenize_prompt(model, p->get<std::string>(), true));
  } else if (p->is_array() && !p->empty() && all_of(*p, &json::is_number_integer)) {
    r.prompts.push_back(get_token_ids(*p, "prompt", model.vocab_size));
  } else if (p->is_array() && !p->empty() && all_of(*p, &json::is_string)) {
    for (const json& s : *p) r.prompts.push_back(tokenize_prompt(model, s.get<std::string>(), true));
  } else if (p->is_array() && !p->empty() && all_of(*p, &json::is_array)) {
    for (const json& ids : *p) r.prompts.push_back(get_token_ids(ids, "prompt", model.vocab_size));
  } else {
    throw bad_request("'prompt' must be a string, an array of strings, an array of token ids or an array of such arrays",
                      "prompt");
  }
  if (const json* v = field(body, "logprobs")) {
    r.top_logprobs = int32_t(get_int(*v, "logprobs", 0, kMaxLogprobs));
    r.want_logprobs = true;
  }
  if (const json* v = field(body, "echo")) r.echo = get_bool(*v, "echo");
  if (const json* v = field(body, "best_of")) {
    int64_t b = get_int(*v, "best_of", 1, kMaxN);
    if (b != r.n) throw bad_request("'best_of' other than n is not supported", "best_of");
  }
  finish_common(r, model);
  return r;
}

ParsedRequest parse_chat_request(const json& body, const ModelInfo& model) {
  ParsedRequest r;
  r.chat = true;
  parse_common(body, model, r);
  const json* m = field(body, "messages");
  if (!m) throw bad_request("'messages' is required", "messages");
  bool add_generation_prompt = true;
  if (const json* v = field(body, "add_generation_prompt")) add_generation_prompt = get_bool(*v, "add_generation_prompt");
  r.prompts.push_back(tokenize_chat(model, parse_messages(*m), add_generation_prompt));
  if (const json* v = field(body, "logprobs")) r.want_logprobs = get_bool(*v, "logprobs");
  if (const json* v = field(body, "top_logprobs")) {
    r.top_logprobs = int32_t(get_int(*v, "top_logprobs", 0, kMaxLogprobs));
    if (!r.want_logprobs && r.top_logprobs > 0)
      throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  }
  finish_common(r, model);
  return r;
}

GenerationRequest ParsedRequest::engine_request(size_t index) const {
  GenerationRequest g = base;
  const auto& prompt = prompts[index / size_t(n)];
  g.prompt = prompt;
  // Without max_tokens a request may use the rest of the context, as in vLLM.
  g.max_tokens = int32_t(max_tokens_given ? max_tokens : max_model_len - int64_t(prompt.size()));
  g.logprobs = want_logprobs ? top_logprobs : -1;
  // Samples of one prompt draw from distinct streams; a given seed still fixes every choice.
  g.sampling.seed = base.sampling.seed + uint64_t(index % size_t(n));
  return g;
}

}  // namespace kiln::server
