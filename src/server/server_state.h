// What every connection of one server shares (internal to src/server).
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <unordered_set>

#include "kiln/engine.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/server.h"

namespace kiln::server {

struct SharedState {
  ServerOptions options;
  std::atomic<Engine*> engine{nullptr};  // null while the model loads
  ModelInfo model;                       // valid once engine is set
  std::unordered_set<int32_t> no_text_ids;  // end-of-generation ids: counted, not printed
  int64_t created = 0;                      // for /v1/models
  std::string model_root;
  Metrics metrics;
  std::atomic<bool> draining{false};
  std::atomic<int32_t> active_jobs{0};  // generation requests in flight
};

}  // namespace kiln::server
