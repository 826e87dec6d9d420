// libFuzzer target on the OpenAI request path (src/server/openai_request.h) with the default
// model's tokenizer and chat template: the first byte picks /v1/completions or
// /v1/chat/completions, the rest is the request body. Whatever the body, parsing must end in a
// parsed request or in the errors the server answers with 400 (ApiError, kiln::Error); any other
// exception would reach the client as a 500, and libFuzzer reports it as a crash. A parsed
// request's prompts are then detokenized (batch and streaming) and its engine requests built, as
// the server does.
//   fuzz_request --write-seeds DIR   writes request bodies to start from.
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/text_file.h"
#include "kiln/error.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace {

using kiln::server::ModelInfo;

struct Fixture {
  std::unique_ptr<kiln::Tokenizer> tokenizer;
  ModelInfo model;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    const std::string data = KILN_TEST_DATA;
    x.tokenizer = kiln::Tokenizer::from_tokenizer_json(data + "/tokenizer_json/smollm/tokenizer.json");
    x.model.tokenizer = x.tokenizer.get();
    x.model.chat_template = kiln::read_text_file(data + "/chat_templates/smollm2-135m-instruct.jinja");
    x.model.served_name = "fuzz";
    x.model.max_model_len = 512;
    x.model.vocab_size = x.tokenizer->vocab_size();
    x.model.end_of_generation = {x.tokenizer->eos_id()};
    return x;
  }();
  return f;
}

void write_seeds(const std::string& dir) {
  const std::vector<std::string> seeds = {
      std::string("C") + R"({"model":"fuzz","prompt":"Once upon a time","max_tokens":8,"temperature":0.7,"top_p":0.9})",
      std::string("C") + R"({"prompt":[[1,2,3],[4,5]],"n":2,"logprobs":3,"echo":true,"stop":["\n","end"],"seed":7})",
      std::string("C") + R"({"prompt":"caf\u00e9 <|im_start|>","stream":true,"stream_options":{"include_usage":true}})",
      std::string("H") + R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]})",
      std::string("H") + R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"logprobs":true,"top_logprobs":2,"max_tokens":4,"stop_token_ids":[2],"ignore_eos":true})",
      std::string("H") + R"({"messages":[{"role":"user","content":"x"}],"frequency_penalty":1.5,"presence_penalty":-1,"repetition_penalty":1.1,"min_p":0.05,"top_k":40})",
      // Once a 500: a number past a double is nlohmann's out_of_range, not its parse_error.
      std::string("C") + R"({"prompt":"x","temperature":1e400})",
  };
  int i = 0;
  for (const std::string& s : seeds) std::ofstream(dir + "/seed" + std::to_string(i++) + ".txt", std::ios::binary) << s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (*argc >= 3 && std::string((*argv)[1]) == "--write-seeds") {
    write_seeds((*argv)[2]);
    std::exit(0);
  }
  fixture();  // load once, outside the timed inputs
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& f = fixture();
  const bool chat = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  kiln::server::ParsedRequest r;
  try {
    const nlohmann::json j = kiln::server::parse_json_body(body);
    r = chat ? kiln::server::parse_chat_request(j, f.model) : kiln::server::parse_completion_request(j, f.model);
  } catch (const kiln::server::ApiError&) {
    return 0;
  } catch (const kiln::Error&) {
    return 0;
  }
  for (const auto& prompt : r.prompts) {
    (void)f.tokenizer->decode(prompt);
    kiln::StreamingDetokenizer stream(*f.tokenizer);
    for (int32_t id : prompt) (void)stream.push(id);
    (void)stream.flush();
  }
  for (size_t i = 0; i < r.prompts.size() * size_t(r.n); ++i) (void)r.engine_request(i);
  return 0;
}
