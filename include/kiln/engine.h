// The serving engine: submit generation requests from any thread, receive their tokens as they
// are sampled, cancel at any time. A step loop on its own thread batches every running request
// into one forward pass per step (continuous batching with chunked prefill over a paged KV cache;
// runtime/scheduler.h has the policy) and samples each request with its own parameters.
//
// One request's bad parameters are rejected at submit() and never reach the loop; an error inside
// a step (e.g. a CUDA failure) fails the requests of that step with finish_reason "error", marks
// the engine unhealthy, and never hangs a caller.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/sampling.h"

namespace kiln {

class Backend;

struct EngineOptions {
  int32_t max_num_seqs = 64;          // most requests in one step (vLLM --max-num-seqs)
  int64_t max_batched_tokens = 2048;  // token budget per step, >= max_num_seqs (--max-num-batched-tokens)
  int32_t block_size = 16;            // tokens per KV block
  int32_t num_kv_blocks = 0;          // the pool; 0: as many as kv_cache_bytes hold
  int64_t kv_cache_bytes = 0;         // 0: 1 GiB on the CPU; on a GPU gpu_memory_fraction of free memory
  double gpu_memory_fraction = 0.9;
  int64_t max_model_len = 0;          // prompt + output tokens per request; 0: the model's context
  // Prefill-first steps (--prefill-first): while prompts wait and fit, a step admits them and the
  // running requests' decodes wait (runtime/scheduler.h, rule 6): more throughput for an offline
  // batch, a stall of every running stream while a prompt is admitted.
  bool prefill_first = false;
  // The latency/throughput dial: when nothing is running, a step waits up to batch_wait for
  // target_batch_size requests to arrive before it starts.
  std::chrono::milliseconds batch_wait{0};
  int32_t target_batch_size = 1;
  size_t max_waiting = 4096;                // queued requests beyond this: submit throws unavailable
  std::vector<int32_t> end_of_generation;   // ids that end a request (EOS, end-of-turn), unless ignore_eos
  // When set, one CSV line per step goes to this file (where a step's wall time goes: scheduling,
  // batch building, the forward, sampling, bookkeeping), for finding host time between forwards.
  std::string step_trace_path;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // extra ids that end the request (the id is emitted)
  int32_t logprobs = -1;                // -1: none; 0: the sampled token's; k (<= 20): and the top k
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;  // log-softmax of the model's logits (before sampling parameters, as vLLM)
};

struct GenerationEvent {
  int32_t token = -1;  // the new token; -1 on a final event that carries none (cancel, error)
  float logprob = 0;
  std::vector<TokenLogprob> top_logprobs;
  bool finished = false;
  std::string finish_reason;  // when finished: "stop", "length", "cancelled" or "error"
  std::string error;          // the message, for "error"
};

// Called on the engine thread for each event of one request, the last one with finished set.
// Keep it short (hand the event to another thread); it may call Engine::cancel, nothing else.
using EventCallback = std::function<void(const GenerationEvent&)>;

struct EngineStats {
  bool healthy = true;
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t kv_blocks_used = 0;
  int32_t kv_blocks_total = 0;
  int32_t block_size = 0;
  int64_t preemptions_total = 0;
  int64_t steps_total = 0;
  int64_t prompt_tokens_total = 0;  // prefill tokens computed (recompute after preemption included)
  int64_t generation_tokens_total = 0;
  int64_t requests_finished_total = 0;
  // The last step: sequences, tokens, wall time.
  int32_t last_step_seqs = 0;
  int64_t last_step_tokens = 0;
  double last_step_seconds = 0;
  int64_t max_model_len = 0;
  // Bandwidth the steps achieved, by the cost model (profile/cost_model.h): the fewest bytes each
  // step must move (weights once, every sequence's KV, activations) over its wall time.
  double last_step_bytes = 0;
  double bytes_total = 0;
  double busy_seconds_total = 0;  // wall time of all steps
  // Of which inside Backend::forward_batch (the device's work, with its launches and the wait for
  // it); the rest of a step is host-only time during which the device idles.
  double forward_seconds_total = 0;
  double host_seconds_total = 0;  // scheduling, batch building, sampling, bookkeeping of all steps
};

class Engine {
 public:
  // The backend must outlive the engine. Builds the KV pool and starts the step loop.
  Engine(Backend& backend, EngineOptions options);
  ~Engine();  // stops the loop; requests still in flight end with "cancelled"
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; thread-safe. Throws kiln::Error: invalid_argument for bad parameters
  // (nothing is queued), unavailable when the queue is full, the engine is draining or unhealthy.
  int64_t submit(GenerationRequest request, EventCallback on_event);
  // Ends a request; its callback gets a final "cancelled" event (unless it already finished) and
  // its KV blocks return to the pool. Thread-safe; false for an unknown or finished id.
  bool cancel(int64_t id);
  // Stops accepting requests (submit throws unavailable) and waits until every admitted one ends.
  void drain();

  EngineStats stats() const;
  bool healthy() const;
  int64_t max_model_len() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Blocking convenience for tools and tests: submits and waits for the whole generation.
struct GenerationResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // when requested
  std::string finish_reason;
  std::string error;
};
GenerationResult generate_blocking(Engine& engine, GenerationRequest request);
// Submits every request at once (so they batch) and waits for all; results in request order.
std::vector<GenerationResult> generate_all_blocking(Engine& engine, std::vector<GenerationRequest> requests);

}  // namespace kiln
