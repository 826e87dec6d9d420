// Prometheus metrics in vLLM's names with a kiln: prefix (CONVENTIONS.md): the engine's gauges
// and counters read from Engine::stats() at scrape time, latency histograms observed by the
// server as tokens leave. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/engine.h"

namespace kiln::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket, _sum and _count lines.
  void render(std::string& out, const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  Histogram ttft, itl, e2e, queue_time, tpot;
  std::atomic<int64_t> http_in_flight{0};
  std::atomic<int64_t> finished_stop{0}, finished_length{0}, finished_error{0}, finished_abort{0};
  std::atomic<int64_t> rejected_overload{0}, rejected_invalid{0};
  std::atomic<int32_t> http_connections{0};           // open now
  std::atomic<int64_t> http_connections_rejected{0};  // refused past --max-connections
  // The copy bandwidth the bandwidth gauges divide by: the GPU's measured ceiling (0: not
  // exported, e.g. on the CPU backend). Set once before serving.
  double bandwidth_ceiling_gbs = 0;

  void count_finish(const std::string& reason);
  // The whole exposition. stats: nullptr while the model loads.
  std::string render(const EngineStats* stats, const std::string& model_name) const;
};

// Resident set size of this process, bytes (0 when /proc is unreadable).
int64_t resident_memory_bytes();

}  // namespace kiln::server
