// kiln run: generate a completion for one prompt, streamed to stdout; timings to stderr.
#include <cstdio>

#include <fmt/core.h>

#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "runtime/generator.h"
#include "tokenizer/chat_format.h"

namespace kiln::cli {
namespace {

struct RunOptions {
  ModelOptions m;
  std::string prompt, prompt_file;
  int32_t n_predict = 128, ctx_size = 4096;
  bool chat = false, ignore_eos = false;
  std::string chat_template, system_prompt;
  SamplingParams sampling;
};

void run(const RunOptions& o) {
  o.sampling.validate();
  KILN_CHECK(o.n_predict >= 0, invalid_argument, "-n/--n-predict must be >= 0, got {}", o.n_predict);
  KILN_CHECK(o.ctx_size > 0, invalid_argument, "-c/--ctx-size must be positive, got {}", o.ctx_size);
  std::string prompt = o.prompt_file.empty() ? o.prompt : read_text_file(o.prompt_file, "prompt file");
  KILN_CHECK(!prompt.empty(), invalid_argument, "no prompt: pass -p TEXT or -f FILE");

  ThreadPool pool(o.m.threads);
  LoadedModel model = load_with_progress(resolve_model_path(o.m.model), pool);
  const Tokenizer& tokenizer = require_tokenizer(model);
  std::vector<int32_t> ids;
  if (o.chat) {
    std::vector<ChatMessage> messages;
    if (!o.system_prompt.empty()) messages.push_back({"system", o.system_prompt});
    messages.push_back({"user", prompt});
    std::string text = render_chat(choose_chat_template(o.chat_template, model.chat_template), messages, true,
                                   chat_special_tokens(tokenizer));
    ids = tokenizer.encode(text, false, true);  // the rendered template already holds any BOS
  } else {
    ids = tokenizer.encode(prompt, tokenizer.add_bos_default(), false);
  }
  int64_t ctx = std::min<int64_t>(o.ctx_size, model.config.context_length);
  KILN_CHECK(int64_t(ids.size()) <= ctx, invalid_argument,
             "the prompt has {} tokens but the context holds {} (raise -c/--ctx-size; this model allows up to {})",
             ids.size(), ctx, model.config.context_length);
  auto backend = make_backend(o.m, model, pool);
  apply_kv_cache_option(*backend, o.m);
  auto seq = backend->new_sequence(ctx);

  GenerateOptions g;
  // The last sampled token is never fed back, so a full context still yields one more token.
  g.max_new_tokens = int32_t(std::min<int64_t>(o.n_predict, ctx - int64_t(ids.size()) + 1));
  g.sampling = o.sampling;
  g.ignore_eos = o.ignore_eos;
  if (!o.chat) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  StreamingDetokenizer detok(tokenizer);
  GenerateResult r = generate(*backend, *seq, tokenizer, ids, g, [&](int32_t id) {
    std::string piece = detok.push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::string rest = detok.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);

  size_t n_gen = r.tokens.size();
  fmt::print(stderr, "\nkiln: backend {}, {} threads\n", backend->name(), pool.size());
  fmt::print(stderr, "kiln: prompt     {:5} tokens in {:8.3f} s = {:8.2f} tok/s\n", ids.size(), r.prompt_seconds,
             double(ids.size()) / r.prompt_seconds);
  // The first generated token comes from the prompt's logits; the rest each cost one decode step.
  if (n_gen > 1)
    fmt::print(stderr, "kiln: generated  {:5} tokens in {:8.3f} s = {:8.2f} tok/s{}\n", n_gen, r.generate_seconds,
               double(n_gen - 1) / r.generate_seconds, r.stopped_by_eos ? " (stopped at end of turn)" : "");
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text for a prompt, streamed to stdout");
  add_model_options(cmd, o->m);
  add_kv_cache_option(cmd, o->m);
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text");
  cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context size in tokens")->capture_default_str();
  cmd->add_option("-s,--seed", o->sampling.seed, "Random seed")->capture_default_str();
  cmd->add_option("--temp", o->sampling.temperature, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", o->sampling.repetition_penalty, "Repetition penalty (1: off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", o->sampling.penalty_last_n, "Tokens the penalties look back over")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o->sampling.presence_penalty, "Presence penalty")->capture_default_str();
  cmd->add_option("--frequency-penalty", o->sampling.frequency_penalty, "Frequency penalty")->capture_default_str();
  cmd->add_flag("--chat", o->chat, "Wrap the prompt in the model's chat template as a user turn");
  cmd->add_option("--chat-template", o->chat_template,
                  "With --chat: a Jinja chat template (file or text) instead of the model's");
  cmd->add_option("--system", o->system_prompt, "With --chat: a system message before the prompt");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-turn tokens");
  cmd->callback([o] { run(*o); });
}

}  // namespace kiln::cli
