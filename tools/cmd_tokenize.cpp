// kiln tokenize / kiln detokenize: text <-> token ids with a model's own tokenizer (a GGUF, a
// Hugging Face directory, or a bare tokenizer.json). Only the vocabulary is read, never the
// weights. Useful on its own, and the hook the tokenizer parity scripts drive.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "model/gguf/gguf_file.h"
#include "tokenizer/chat_format.h"

namespace kiln::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string prompt, file;
  std::string format = "ids";
  std::string bos = "auto";
  bool no_parse_special = false;
  bool timing = false;
  bool chat = false;
  std::string chat_template, system_prompt;
};

struct DetokenizeOptions {
  std::string model;
  std::string ids;
};

// The tokenizer of -m: a tokenizer.json file itself, or any model kiln loads (without weights).
struct TextModel {
  std::unique_ptr<Tokenizer> owned;
  LoadedModel model;
  std::string chat_template;
  const Tokenizer& tokenizer() const { return owned ? *owned : require_tokenizer(model); }
};

TextModel open_text_model(const std::string& arg) {
  TextModel t;
  const std::string path = resolve_model_path(arg);
  if (std::filesystem::path(path).filename() == "tokenizer.json") {
    t.owned = Tokenizer::from_tokenizer_json(path);
    return t;
  }
  if (std::filesystem::path(path).extension() == ".gguf") {
    // The vocabulary alone: a vocab-only GGUF (as llama.cpp's tests use) has no config to read.
    const gguf::GgufFile file = gguf::GgufFile::open(path);
    t.owned = Tokenizer::from_gguf(file);
    t.chat_template = file.get_string("tokenizer.chat_template").value_or("");
    return t;
  }
  ThreadPool pool(1);
  t.model = load_model(path, pool, /*with_weights=*/false);
  t.chat_template = t.model.chat_template;
  return t;
}

void run_tokenize(const TokenizeOptions& o) {
  KILN_CHECK(o.format == "ids" || o.format == "pieces" || o.format == "json" || o.format == "count" ||
                 o.format == "text",
             invalid_argument, "--format must be ids, pieces, json, count or text, got '{}'", o.format);
  KILN_CHECK(o.bos == "auto" || o.bos == "yes" || o.bos == "no", invalid_argument,
             "--bos must be auto, yes or no, got '{}'", o.bos);
  KILN_CHECK(o.prompt.empty() || o.file.empty(), invalid_argument, "pass the text with -p or -f, not both");
  const TextModel m = open_text_model(o.model);
  const Tokenizer& tok = m.tokenizer();
  std::string text = !o.prompt.empty() ? o.prompt : !o.file.empty() ? read_text_file(o.file, "text file") : read_all(std::cin);
  bool add_bos = o.bos == "auto" ? tok.add_bos_default() : o.bos == "yes";
  if (o.chat) {
    std::vector<ChatMessage> messages;
    if (!o.system_prompt.empty()) messages.push_back({"system", o.system_prompt});
    messages.push_back({"user", text});
    text = render_chat(choose_chat_template(o.chat_template, m.chat_template), messages, true,
                       chat_special_tokens(tok));
    if (o.bos == "auto") add_bos = false;  // a template writes BOS itself when the model wants one
  }
  if (o.format == "text") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(text, add_bos, !o.no_parse_special);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.timing) {
    fmt::print(stderr, "kiln: {} bytes -> {} tokens in {:.3f} s ({:.1f} MB/s)\n", text.size(), ids.size(), seconds,
               double(text.size()) / 1e6 / std::max(seconds, 1e-9));
  }

  if (o.format == "count") {
    fmt::print("{}\n", ids.size());
  } else if (o.format == "ids") {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
    fmt::print("{}]\n", line);
  } else if (o.format == "pieces") {
    // One token a line: id, then its bytes as a JSON string (so spaces and partial UTF-8 show).
    for (int32_t id : ids) {
      fmt::print("{:>8} {}\n", id,
                 nlohmann::json(tok.token_bytes(id)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  } else {
    nlohmann::json out = {{"ids", ids}, {"n_tokens", ids.size()}};
    fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
}

void run_detokenize(const DetokenizeOptions& o) {
  const TextModel m = open_text_model(o.model);
  const Tokenizer& tok = m.tokenizer();
  const std::vector<int32_t> ids = parse_token_ids(o.ids.empty() ? read_all(std::cin) : o.ids, "detokenize");
  for (int32_t id : ids) {
    KILN_CHECK(id < tok.vocab_size(), invalid_argument, "token id {} is outside the vocabulary (0..{})", id,
               tok.vocab_size() - 1);
  }
  const std::string text = tok.decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  auto t = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Turn text into token ids with the model's tokenizer");
  cmd->add_option("-m,--model", t->model,
                  "A .gguf file, a Hugging Face directory, or a tokenizer.json (default: the fetched SmolLM2)");
  cmd->add_option("-p,--prompt", t->prompt, "The text (else -f, else standard input)");
  cmd->add_option("-f,--file", t->file, "Read the text from a file");
  cmd->add_option("--format", t->format,
                  "ids ([1, 2]), pieces (one token a line), json, count, or text (the text that would be encoded)")
      ->capture_default_str();
  cmd->add_option("--bos", t->bos, "Prepend BOS: auto (the tokenizer's default), yes, no")->capture_default_str();
  cmd->add_flag("--no-parse-special", t->no_parse_special,
                "Treat special-token text such as <|im_start|> as plain text");
  cmd->add_flag("--timing", t->timing, "Print the encode time and MB/s to stderr");
  cmd->add_flag("--chat", t->chat, "Render the text as a user turn with the chat template first");
  cmd->add_option("--chat-template", t->chat_template, "With --chat: a Jinja template (file or text) to use instead");
  cmd->add_option("--system", t->system_prompt, "With --chat: a system message before the user turn");
  cmd->callback([t] { run_tokenize(*t); });

  auto d = std::make_shared<DetokenizeOptions>();
  CLI::App* dcmd = app.add_subcommand("detokenize", "Turn token ids back into text");
  dcmd->add_option("-m,--model", d->model, "As for tokenize");
  dcmd->add_option("ids", d->ids, "Token ids: \"1,2,3\", \"1 2 3\" or \"[1, 2, 3]\" (else standard input)");
  dcmd->callback([d] { run_detokenize(*d); });
}

}  // namespace kiln::cli
