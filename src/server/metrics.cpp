#include "server/metrics.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

namespace kiln::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  std::lock_guard lock(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help,
                       const std::string& labels) const {
  std::lock_guard lock(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cum);
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, count_);
}

namespace {
// vLLM's buckets.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0};
}
}  // namespace

Metrics::Metrics() : ttft(ttft_buckets()), itl(itl_buckets()), e2e(e2e_buckets()), queue_time(e2e_buckets()), tpot(itl_buckets()) {}

void Metrics::count_finish(const std::string& reason) {
  if (reason == "stop") ++finished_stop;
  else if (reason == "length") ++finished_length;
  else if (reason == "error") ++finished_error;
  else ++finished_abort;
}

int64_t resident_memory_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * sysconf(_SC_PAGESIZE);
}

std::string Metrics::render(const EngineStats* s, const std::string& model_name) const {
  std::string out;
  std::string l = fmt::format("model_name=\"{}\"", model_name);
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP kiln:{} {}\n# TYPE kiln:{} gauge\nkiln:{}{{{}}} {}\n", name, help, name, name, l, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP kiln:{} {}\n# TYPE kiln:{} counter\nkiln:{}{{{}}} {}\n", name, help, name, name, l, v);
  };
  EngineStats z;
  const EngineStats& e = s ? *s : z;
  gauge("num_requests_running", "Requests in the running batch.", e.running);
  gauge("num_requests_waiting", "Requests waiting to be scheduled.", e.waiting);
  gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).",
        e.kv_blocks_total > 0 ? double(e.kv_blocks_used) / e.kv_blocks_total : 0.0);
  gauge("kv_cache_blocks_used", "KV cache blocks in use.", e.kv_blocks_used);
  gauge("kv_cache_blocks_total", "KV cache blocks in the pool.", e.kv_blocks_total);
  gauge("engine_healthy", "1 when the engine is healthy.", s ? (e.healthy ? 1 : 0) : 0);
  gauge("http_requests_in_flight", "Generation requests the HTTP server is serving.", double(http_in_flight.load()));
  gauge("http_connections", "Open HTTP connections.", double(http_connections.load()));
  counter("http_connections_rejected_total", "Connections refused with 503 past --max-connections.",
          double(http_connections_rejected.load()));
  counter("prompt_tokens_total", "Prefill tokens computed (recomputation after preemption included).",
          double(e.prompt_tokens_total));
  counter("generation_tokens_total", "Generated tokens.", double(e.generation_tokens_total));
  counter("num_preemptions_total", "Requests preempted (recomputed later) for lack of KV blocks.",
          double(e.preemptions_total));
  counter("engine_steps_total", "Engine steps run.", double(e.steps_total));
  // Memory-bandwidth utilization by the cost model (profile/cost_model.h): the bytes each step
  // must move (weights once, every sequence's KV, activations) over the steps' wall time.
  counter("model_bytes_moved_total", "Bytes the steps had to move through device memory (cost model).",
          e.bytes_total);
  counter("engine_busy_seconds_total", "Wall time spent inside engine steps.", e.busy_seconds_total);
  gauge("achieved_bandwidth_gbs", "Average bytes moved per second of step time, GB/s (cost model).",
        e.busy_seconds_total > 0 ? e.bytes_total / e.busy_seconds_total / 1e9 : 0.0);
  gauge("last_step_bandwidth_gbs", "GB/s of the last step (cost model).",
        e.last_step_seconds > 0 ? e.last_step_bytes / e.last_step_seconds / 1e9 : 0.0);
  if (bandwidth_ceiling_gbs > 0) {
    gauge("bandwidth_ceiling_gbs", "The device's measured copy bandwidth (kiln profile --calibrate).",
          bandwidth_ceiling_gbs);
    gauge("achieved_bandwidth_fraction", "achieved_bandwidth_gbs / bandwidth_ceiling_gbs.",
          e.busy_seconds_total > 0 ? e.bytes_total / e.busy_seconds_total / 1e9 / bandwidth_ceiling_gbs : 0.0);
  }
  out += "# HELP kiln:request_success_total Finished requests by finish reason.\n"
         "# TYPE kiln:request_success_total counter\n";
  out += fmt::format("kiln:request_success_total{{{},finished_reason=\"stop\"}} {}\n", l, finished_stop.load());
  out += fmt::format("kiln:request_success_total{{{},finished_reason=\"length\"}} {}\n", l, finished_length.load());
  out += fmt::format("kiln:request_success_total{{{},finished_reason=\"abort\"}} {}\n", l, finished_abort.load());
  counter("request_failure_total", "Requests that failed inside the engine.", double(finished_error.load()));
  counter("request_rejected_overload_total", "Requests refused with 429/503 (overload, draining).",
          double(rejected_overload.load()));
  counter("request_rejected_invalid_total", "Requests refused with 4xx (invalid).", double(rejected_invalid.load()));
  ttft.render(out, "kiln:time_to_first_token_seconds", "Time from request arrival to its first token.", l);
  itl.render(out, "kiln:inter_token_latency_seconds", "Time between consecutive tokens of a request.", l);
  tpot.render(out, "kiln:request_time_per_output_token_seconds", "Mean time per output token after the first.", l);
  e2e.render(out, "kiln:e2e_request_latency_seconds", "Time from request arrival to its last token.", l);
  queue_time.render(out, "kiln:request_queue_time_seconds",
                    "Time from request arrival to its first token: an upper bound on queueing (the engine does not "
                    "report when it admits a request).",
                    l);
  out += "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
         "# TYPE process_resident_memory_bytes gauge\n";
  out += fmt::format("process_resident_memory_bytes {}\n", resident_memory_bytes());
  return out;
}

}  // namespace kiln::server
