// kiln serve: the OpenAI-compatible HTTP server (src/server) over the batching engine.
#include <filesystem>

#include <fmt/core.h>

#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "kiln/engine.h"
#include "server/server.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/ceilings.h"
#endif

namespace kiln::cli {
namespace {

struct ServeOptions {
  ModelOptions m;
  server::ServerOptions http;
  std::string served_model_name, chat_template;
  int64_t kv_cache_mb = 0;
  EngineOptions engine;
  int64_t batch_wait_ms = 0;
  int64_t drain_timeout_s = 600;
  int64_t idle_timeout_s = 60;
};

void serve(ServeOptions& o) {
  KILN_CHECK(o.http.max_body_bytes > 0, invalid_argument, "--max-body-bytes must be positive");
  KILN_CHECK(o.http.max_concurrent_requests > 0, invalid_argument, "--max-concurrent-requests must be positive");
  KILN_CHECK(o.http.max_connections > 0, invalid_argument, "--max-connections must be positive");
  KILN_CHECK(o.idle_timeout_s > 0, invalid_argument, "--idle-timeout must be positive");
  if (o.kv_cache_mb > 0) o.engine.kv_cache_bytes = o.kv_cache_mb << 20;
  o.engine.batch_wait = std::chrono::milliseconds(o.batch_wait_ms);
  o.http.drain_timeout = std::chrono::seconds(o.drain_timeout_s);
  o.http.idle_timeout = std::chrono::seconds(o.idle_timeout_s);
  if (o.http.api_key.empty())
    if (const char* k = std::getenv("KILN_API_KEY")) o.http.api_key = k;

  // Listen first: /health answers 503 while the model loads.
  server::Server srv(o.http);
  srv.start();
  fmt::print(stderr, "kiln serve: listening on http://{}:{} (loading the model; /health is 503 until ready)\n",
             o.http.host, srv.port());

  ThreadPool pool(o.m.threads);
  std::string path = resolve_model_path(o.m.model);
  LoadedModel model = load_with_progress(path, pool);
  const Tokenizer& tokenizer = require_tokenizer(model);
  std::string chat_template;
  if (!o.chat_template.empty() || !model.chat_template.empty())
    chat_template = choose_chat_template(o.chat_template, model.chat_template);
  std::vector<int32_t> eog = model.eos_token_ids;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (tokenizer.is_end_of_generation(id) && std::find(eog.begin(), eog.end(), id) == eog.end()) eog.push_back(id);
  o.engine.end_of_generation = eog;
  int32_t vocab = model.config.vocab_size;
  auto backend = make_backend(o.m, model, pool);
  apply_kv_cache_option(*backend, o.m);
  Engine engine(*backend, o.engine);
  EngineStats st = engine.stats();
  fmt::print(stderr, "kiln serve: engine on {}: {} KV blocks of {} tokens, max_model_len {}, max_num_seqs {}\n",
             backend->name(), st.kv_blocks_total, st.block_size, engine.max_model_len(), o.engine.max_num_seqs);

  server::ModelInfo info;
  info.tokenizer = &tokenizer;
  info.chat_template = chat_template;
  info.served_name = o.served_model_name.empty() ? std::filesystem::path(path).filename().string() : o.served_model_name;
  info.root = path;
  info.max_model_len = engine.max_model_len();
  info.vocab_size = vocab;
  info.end_of_generation = eog;
#ifdef KILN_HAVE_CUDA
  if (backend->name() == "cuda") info.bandwidth_ceiling_gbs = cuda::current_ceilings().copy_gbs;
#endif
  srv.attach(engine, info);
  fmt::print(stderr, "kiln serve: ready: model '{}' at http://{}:{}/v1 (chat page at /){}\n", info.served_name,
             o.http.host, srv.port(), o.http.api_key.empty() ? "" : ", API key required");
  srv.wait();
  engine.drain();
  fmt::print(stderr, "kiln serve: drained, exiting\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API (and a chat page at /)");
  add_model_options(cmd, o->m);
  add_kv_cache_option(cmd, o->m);
  cmd->add_option("--host", o->http.host, "Address to listen on (0.0.0.0 exposes the server to the network)")
      ->capture_default_str();
  cmd->add_option("--port", o->http.port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->http.api_key, "Require 'Authorization: Bearer KEY' on /v1/* (also $KILN_API_KEY)");
  cmd->add_option("--served-model-name", o->served_model_name, "Model name in the API (default: the file name)");
  cmd->add_option("--chat-template", o->chat_template, "A Jinja chat template (file or text) instead of the model's");
  add_engine_options(cmd, o->engine, o->kv_cache_mb);
  cmd->add_option("--batch-wait-ms", o->batch_wait_ms, "When idle, wait up to this long for --target-batch-size requests")
      ->capture_default_str();
  cmd->add_option("--target-batch-size", o->engine.target_batch_size, "See --batch-wait-ms")->capture_default_str();
  cmd->add_option("--max-waiting", o->engine.max_waiting, "Queued requests beyond this get 503")->capture_default_str();
  cmd->add_option("--max-concurrent-requests", o->http.max_concurrent_requests,
                  "HTTP generation requests in flight; more get 429 + Retry-After")
      ->capture_default_str();
  cmd->add_option("--max-connections", o->http.max_connections, "Open connections; more get 503 + Retry-After")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", o->http.max_body_bytes, "Larger request bodies get 413")->capture_default_str();
  cmd->add_option("--http-threads", o->http.http_threads, "I/O threads")->capture_default_str();
  cmd->add_option("--allowed-origin", o->http.allowed_origin, "Send CORS headers for this origin (default: none)");
  cmd->add_option("--drain-timeout", o->drain_timeout_s, "Seconds SIGTERM waits for running requests")->capture_default_str();
  cmd->add_option("--idle-timeout", o->idle_timeout_s, "Seconds an idle connection stays open")->capture_default_str();
  cmd->callback([o] { serve(*o); });
}

}  // namespace kiln::cli
