// kiln's OpenAI-compatible HTTP server (Boost.Beast over Boost.Asio): /v1/models,
// /v1/completions, /v1/chat/completions (streaming over SSE), /health, /metrics, /tokenize,
// /detokenize and the chat page at /. Asynchronous: a few I/O threads serve every connection;
// each connection runs on its own strand, and the engine's events are posted onto it.
//
// Life cycle: start() binds and serves (/health answers 503 until a model is attached);
// attach() hands it the engine; wait() returns after SIGTERM/SIGINT (or request_shutdown())
// once every running request has finished (new ones get 503 meanwhile) or drain_timeout passed.
// A second signal exits at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "server/openai_request.h"

namespace kiln {
class Engine;
}

namespace kiln::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                  // 0: any free port (see Server::port())
  std::string api_key;                   // "": no authentication
  std::string allowed_origin;            // CORS: "" (default) sends no CORS headers
  size_t max_body_bytes = 8u << 20;      // larger request bodies get 413
  int32_t max_concurrent_requests = 512; // generation requests in flight; more get 429 + Retry-After
  int32_t max_connections = 2048;        // open connections; more get 503 + Retry-After
  int32_t http_threads = 2;
  std::chrono::seconds idle_timeout{60};   // a connection with no complete request for this long is closed
  std::chrono::seconds write_timeout{60};  // a client that reads nothing for this long is dropped
  std::chrono::seconds drain_timeout{600}; // SIGTERM waits at most this long for running requests
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();  // throws kiln::Error(io) when the address cannot be bound
  uint16_t port() const;
  // The engine (and the tokenizer in `model`) must outlive the server's serving: call wait() first.
  void attach(Engine& engine, ModelInfo model);
  void wait();
  void request_shutdown();
  bool shutdown_requested() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// The chat page (src/server/chat_page.html, embedded at build time).
extern const char* const kChatPage;

}  // namespace kiln::server
