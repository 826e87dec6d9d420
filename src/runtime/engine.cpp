// The engine's step loop: scheduler -> forward_batch -> sample -> events. See include/kiln/engine.h.
#include "kiln/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/core.h>

#include "backend/backend.h"
#include "core/check.h"
#include "profile/cost_model.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

// What the engine keeps per request beside the scheduler's state.
struct Live {
  GenerationRequest request;
  EventCallback on_event;
  Sampler sampler;
  std::vector<int32_t> history;  // prompt + generated, for the penalties
  int32_t generated = 0;
  // Greedy without penalties or logprobs: the argmax of the raw logits is the whole answer, so
  // the backend may find it on the device and skip sending the row back.
  bool argmax_only = false;

  Live(GenerationRequest r, EventCallback cb)
      : request(std::move(r)), on_event(std::move(cb)), sampler(request.sampling), history(request.prompt) {
    const SamplingParams& p = request.sampling;
    argmax_only = p.temperature <= 0 && request.logprobs < 0 && p.repetition_penalty == 1.0f &&
                  p.presence_penalty == 0 && p.frequency_penalty == 0;
  }
};

// log-softmax of the raw logits at `token`, and the top k (k <= 20) when asked.
void fill_logprobs(std::span<const float> logits, int32_t token, int32_t k, GenerationEvent& ev) {
  float max_logit = -INFINITY;
  for (float v : logits) max_logit = std::max(max_logit, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - max_logit);
  const float log_z = float(max_logit + std::log(sum));
  ev.logprob = logits[size_t(token)] - log_z;
  if (k <= 0) return;
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  const size_t top = std::min(size_t(k), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(top), ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  for (size_t i = 0; i < top; ++i) ev.top_logprobs.push_back({ids[i], logits[size_t(ids[i])] - log_z});
}

}  // namespace

struct Engine::Impl {
  Backend& backend;
  EngineOptions options;
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<Scheduler> scheduler;
  std::unordered_set<int32_t> end_ids;
  int64_t max_model_len = 0;

  // Shared with submitting threads, under `mutex`.
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::pair<int64_t, std::unique_ptr<Live>>> incoming;
  std::vector<int64_t> cancels;
  std::unordered_set<int64_t> admitted;  // ids submitted and not yet finished
  int64_t next_id = 1;
  bool stopping = false;
  bool draining = false;
  bool healthy = true;
  EngineStats stats;
  std::condition_variable idle;  // signalled when `admitted` empties

  // Owned by the loop thread.
  std::unordered_map<int64_t, std::unique_ptr<Live>> live;
  std::vector<float> logits;  // reused every step: a batch of 256 rows of 128k floats is 128 MB
  std::vector<int32_t> argmax;
  // step()'s per-chunk buffers, also reused: at thousands of sequences, allocating them every step
  // shows in the host time. step_lives[k] is chunk k's request (one lookup in `live` per chunk).
  std::vector<Live*> step_lives;
  std::vector<BatchEntry> step_entries;
  std::vector<SampledToken> step_sampled;
  // Events go out after the scheduler and the stats have taken the step in, so a client that
  // sees its request finish also sees its KV blocks freed in stats() (and in /metrics).
  std::vector<std::pair<Live*, GenerationEvent>> step_events;
  std::vector<profile::SeqShape> step_shapes;
  // The step trace (EngineOptions::step_trace_path), CSV, one line per step.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> trace{nullptr, &std::fclose};
  Clock::time_point last_step_end = Clock::now();
  std::thread loop;

  Impl(Backend& b, EngineOptions o) : backend(b), options(std::move(o)) {}

  void emit_final(Live& r, const std::string& reason, const std::string& error = {}) {
    GenerationEvent ev;
    ev.finished = true;
    ev.finish_reason = reason;
    ev.error = error;
    r.on_event(ev);
  }

  // Removes a finished request everywhere and wakes drain().
  void retire(int64_t id) {
    live.erase(id);
    std::lock_guard lock(mutex);
    admitted.erase(id);
    ++stats.requests_finished_total;
    if (admitted.empty()) idle.notify_all();
  }

  void take_incoming() {
    std::deque<std::pair<int64_t, std::unique_ptr<Live>>> fresh;
    std::vector<int64_t> to_cancel;
    {
      std::lock_guard lock(mutex);
      fresh.swap(incoming);
      to_cancel.swap(cancels);
    }
    for (auto& [id, r] : fresh) {
      RequestSpec spec;
      spec.id = id;
      spec.prompt = r->request.prompt;
      spec.max_new_tokens = r->request.max_tokens;
      spec.arrival_time = Clock::now();
      scheduler->submit(std::move(spec));  // validated in submit(); cannot fail here
      live.emplace(id, std::move(r));
    }
    for (int64_t id : to_cancel) {
      auto it = live.find(id);
      if (it == live.end()) continue;  // finished meanwhile
      scheduler->cancel(id);
      emit_final(*it->second, "cancelled");
      retire(id);
    }
    std::lock_guard lock(mutex);
    refresh_queue_stats();
  }

  // A step failed: every live request ends with the error and the engine turns unhealthy.
  void fail_all(const std::string& message) {
    {
      std::lock_guard lock(mutex);
      healthy = false;
      stats.healthy = false;
    }
    std::vector<int64_t> ids;
    for (auto& [id, r] : live) ids.push_back(id);
    for (int64_t id : ids) {
      emit_final(*live[id], "error", message);
      retire(id);
    }
  }

  void step() {
    const auto t_begin = Clock::now();
    const StepPlan plan = scheduler->schedule();
    std::vector<SampledToken>& sampled = step_sampled;
    auto& events = step_events;
    sampled.clear();
    events.clear();
    const auto t0 = Clock::now();
    auto t_fwd0 = t0, t_fwd1 = t0;
    if (!plan.empty()) {
      std::vector<BatchEntry>& entries = step_entries;
      entries.clear();
      step_lives.clear();
      const bool device_sampling = backend.samples_on_device();
      for (const ScheduledChunk& c : plan.chunks) {
        Live* live_request = live.at(c.id).get();
        step_lives.push_back(live_request);
        const Live& r = *live_request;
        BatchEntry e{c.tokens, c.first_position, c.block_table, c.needs_logits, c.needs_logits && r.argmax_only};
        // Sampled on the device unless the request wants logprobs (those need the row here).
        if (device_sampling && c.needs_logits && !r.argmax_only && r.request.logprobs < 0) {
          e.sampling = &r.request.sampling;
          e.history = r.history;
          e.draw = uint64_t(r.generated);
        }
        entries.push_back(e);
      }
      t_fwd0 = Clock::now();
      backend.forward_batch(*pool, entries, logits, &argmax);
      t_fwd1 = Clock::now();
      const size_t vocab = size_t(backend.config().vocab_size);
      size_t row = 0;
      for (size_t k = 0; k < plan.chunks.size(); ++k) {
        const ScheduledChunk& c = plan.chunks[k];
        if (!c.needs_logits) continue;
        const size_t this_row = row++;
        Live& r = *step_lives[k];
        // A row whose token was chosen on the device (greedy, or device sampling) may not have its
        // logits on the host at all (Backend::forward_batch).
        const bool drawn = r.argmax_only || entries[k].sampling != nullptr;
        std::span<float> l;
        if (!drawn) l = std::span<float>(logits.data() + this_row * vocab, vocab);
        // Logprobs describe the model's distribution: taken from the row before the sampler
        // applies penalties and temperature to it.
        std::vector<float> raw;
        if (r.request.logprobs >= 0) raw.assign(l.begin(), l.end());
        const int32_t token = drawn ? argmax[this_row] : r.sampler.sample(l, r.history);
        GenerationEvent ev;
        if (r.request.logprobs >= 0) fill_logprobs(raw, token, r.request.logprobs, ev);
        ev.token = token;
        r.history.push_back(token);
        ++r.generated;
        const bool stop = (!r.request.ignore_eos && end_ids.count(token)) ||
                          std::find(r.request.stop_token_ids.begin(), r.request.stop_token_ids.end(), token) !=
                              r.request.stop_token_ids.end();
        ev.finished = stop || r.generated >= r.request.max_tokens;
        if (ev.finished) ev.finish_reason = stop ? "stop" : "length";
        sampled.push_back({c.id, token, stop});
        events.emplace_back(&r, std::move(ev));
      }
    }
    const auto t_sampled = Clock::now();
    const double seconds = std::chrono::duration<double>(t_sampled - t0).count();
    double bytes = 0;
    if (!plan.empty()) {
      std::vector<profile::SeqShape>& shapes = step_shapes;
      shapes.clear();
      for (const ScheduledChunk& c : plan.chunks) shapes.push_back({int64_t(c.tokens.size()), c.first_position});
      // The CPU reference keeps everything in fp32; GPU backends use the default widths.
      const profile::Widths widths = backend.kv_bytes_per_element() == 4 ? profile::Widths{4, 4, 4, 4} : profile::Widths{};
      bytes = profile::batch_cost(backend.config(), shapes, int64_t(sampled.size()), widths).bytes;
    }
    const std::vector<FinishedRequest> finished = scheduler->on_step_done(sampled);
    const auto t_done = Clock::now();
    const double forward_s = secs(t_fwd0, t_fwd1), total_s = secs(t_begin, t_done);
    record_step(plan, sampled.size(), seconds, bytes, forward_s, total_s - forward_s);
    for (auto& [r, ev] : events) r->on_event(ev);
    for (const FinishedRequest& f : finished) retire(f.id);
    if (trace) {
      const auto t_end = Clock::now();
      // step, chunks, decode tokens, prefill tokens, sampled rows, then milliseconds: since the
      // previous step ended (loop, intake), schedule, batch building, forward, sampling + cost
      // model, on_step_done, events + retire.
      fmt::print(trace.get(), "{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f}\n", stats.steps_total,
                 plan.chunks.size(), plan.stats.decode_tokens, plan.stats.prefill_tokens, sampled.size(),
                 1e3 * secs(last_step_end, t_begin), 1e3 * secs(t_begin, t0), 1e3 * secs(t0, t_fwd0),
                 1e3 * forward_s, 1e3 * secs(t_fwd1, t_sampled), 1e3 * secs(t_sampled, t_done),
                 1e3 * secs(t_done, t_end));
      last_step_end = t_end;
    }
  }

  static double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

  void record_step(const StepPlan& plan, size_t n_sampled, double seconds, double bytes, double forward_s,
                   double host_s) {
    std::lock_guard lock(mutex);
    ++stats.steps_total;
    stats.forward_seconds_total += forward_s;
    stats.host_seconds_total += host_s;
    stats.prompt_tokens_total += plan.stats.prefill_tokens;
    stats.generation_tokens_total += int64_t(n_sampled);
    stats.last_step_seqs = plan.stats.num_seqs;
    stats.last_step_tokens = plan.num_tokens();
    stats.last_step_seconds = seconds;
    stats.last_step_bytes = bytes;
    stats.bytes_total += bytes;
    stats.busy_seconds_total += seconds;
    refresh_queue_stats();
  }

  // Queue and KV figures; the caller holds `mutex`.
  void refresh_queue_stats() {
    stats.preemptions_total = scheduler->num_preemptions();
    stats.running = int32_t(scheduler->num_running());
    stats.waiting = int32_t(scheduler->num_waiting() + incoming.size());
    stats.kv_blocks_used = scheduler->block_manager().num_used_blocks();
  }

  void run() {
    for (;;) {
      {
        std::unique_lock lock(mutex);
        wake.wait(lock, [&] { return stopping || !incoming.empty() || !cancels.empty() || !live.empty(); });
        if (stopping) break;
      }
      try {
        take_incoming();
        if (!scheduler->has_work()) continue;
        if (scheduler->should_wait(Clock::now())) {
          std::unique_lock lock(mutex);
          wake.wait_for(lock, std::chrono::milliseconds(1));
          continue;
        }
        step();
      } catch (const std::exception& e) {
        fail_all(std::string("the engine step failed: ") + e.what());
        // A failed step leaves the scheduler's step open; rebuild it so nothing dangles.
        scheduler = std::make_unique<Scheduler>(scheduler->config());
      }
    }
    // Shutting down: whoever is still waiting hears "cancelled".
    for (auto& [id, r] : live) emit_final(*r, "cancelled");
    live.clear();
    std::lock_guard lock(mutex);
    for (auto& [id, r] : incoming) emit_final(*r, "cancelled");
    incoming.clear();
    admitted.clear();
    idle.notify_all();
  }
};

Engine::Engine(Backend& backend, EngineOptions options) : impl_(std::make_unique<Impl>(backend, std::move(options))) {
  Impl& m = *impl_;
  const EngineOptions& o = m.options;
  KILN_CHECK(o.block_size > 0 && o.block_size <= 1024, invalid_argument, "block size must be in 1..1024, got {}",
             o.block_size);
  KILN_CHECK(o.gpu_memory_fraction > 0 && o.gpu_memory_fraction <= 1, invalid_argument,
             "gpu memory fraction must be in (0, 1], got {}", o.gpu_memory_fraction);
  int32_t blocks = o.num_kv_blocks;
  int64_t step_reserve = 0;  // kept out of the default pool for the largest step's activations
  if (blocks <= 0) {
    int64_t bytes = o.kv_cache_bytes;
    if (bytes <= 0) {
      step_reserve = backend.step_memory_bytes(o.max_batched_tokens, o.max_num_seqs);
      bytes = backend.default_kv_cache_bytes(o.gpu_memory_fraction) - step_reserve;
    }
    blocks = backend.kv_blocks_for_budget(bytes, o.block_size);
  }
  KILN_CHECK(blocks > 0, invalid_argument, "the KV cache budget holds no block of {} tokens ({} bytes a token){}",
             o.block_size, backend.kv_bytes_per_token(),
             step_reserve > 0 ? fmt::format("; {} MB went to the activations of a {}-token step: lower "
                                            "--max-num-batched-tokens or raise --gpu-memory-fraction",
                                            step_reserve >> 20, o.max_batched_tokens)
                              : std::string());
  const int64_t context = backend.config().context_length;
  m.max_model_len = std::min<int64_t>(o.max_model_len > 0 ? o.max_model_len : context, int64_t(blocks) * o.block_size);
  KILN_CHECK(o.max_model_len <= 0 || o.max_model_len <= context, invalid_argument,
             "max model length {} exceeds the model's context of {}", o.max_model_len, context);

  SchedulerConfig sc;
  sc.num_kv_blocks = blocks;
  sc.block_size = o.block_size;
  sc.max_num_seqs = o.max_num_seqs;
  sc.max_batched_tokens = o.max_batched_tokens;
  sc.max_model_len = m.max_model_len;
  sc.prefill_first = o.prefill_first;
  sc.batch_window = {o.batch_wait, o.target_batch_size};
  sc.validate();
  m.scheduler = std::make_unique<Scheduler>(sc);
  m.pool = backend.new_kv_pool(blocks, o.block_size);
  m.end_ids.insert(o.end_of_generation.begin(), o.end_of_generation.end());
  if (!o.step_trace_path.empty()) {
    m.trace.reset(std::fopen(o.step_trace_path.c_str(), "w"));
    KILN_CHECK(m.trace != nullptr, invalid_argument, "cannot write the step trace {}", o.step_trace_path);
    fmt::print(m.trace.get(), "step,chunks,decode_tokens,prefill_tokens,sampled,gap_ms,schedule_ms,build_ms,"
                              "forward_ms,sample_ms,step_done_ms,events_ms\n");
  }
  m.stats.kv_blocks_total = blocks;
  m.stats.block_size = o.block_size;
  m.stats.max_model_len = m.max_model_len;
  m.loop = std::thread([&m] { m.run(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  impl_->loop.join();
}

int64_t Engine::submit(GenerationRequest request, EventCallback on_event) {
  Impl& m = *impl_;
  const int64_t vocab = m.backend.config().vocab_size;
  KILN_CHECK(on_event != nullptr, invalid_argument, "a request needs an event callback");
  KILN_CHECK(!request.prompt.empty(), invalid_argument, "the prompt is empty");
  for (int32_t t : request.prompt)
    KILN_CHECK(t >= 0 && t < vocab, invalid_argument, "prompt token id {} is outside the vocabulary [0, {})", t, vocab);
  for (int32_t t : request.stop_token_ids)
    KILN_CHECK(t >= 0 && t < vocab, invalid_argument, "stop token id {} is outside the vocabulary [0, {})", t, vocab);
  KILN_CHECK(request.max_tokens >= 1, invalid_argument, "max_tokens must be at least 1, got {}", request.max_tokens);
  KILN_CHECK(request.logprobs >= -1 && request.logprobs <= 20, invalid_argument,
             "top logprobs must be in 0..20, got {}", request.logprobs);
  request.sampling.validate();
  const int64_t prompt_len = int64_t(request.prompt.size());
  KILN_CHECK(prompt_len < m.max_model_len, invalid_argument,
             "the prompt has {} tokens but the maximum context length is {}", prompt_len, m.max_model_len);
  // Cap the output to the context, as vLLM does for a max_tokens beyond what fits.
  request.max_tokens = int32_t(std::min<int64_t>(request.max_tokens, m.max_model_len - prompt_len));

  auto live = std::make_unique<Live>(std::move(request), std::move(on_event));
  int64_t id = 0;
  {
    std::lock_guard lock(m.mutex);
    KILN_CHECK(m.healthy, unavailable, "the engine is unhealthy after an error; restart it");
    KILN_CHECK(!m.draining && !m.stopping, unavailable, "the engine is shutting down");
    KILN_CHECK(m.incoming.size() + size_t(m.stats.waiting) < m.options.max_waiting, unavailable,
               "too many requests are waiting ({}); retry later", m.options.max_waiting);
    id = m.next_id++;
    m.incoming.emplace_back(id, std::move(live));
    m.admitted.insert(id);
  }
  m.wake.notify_all();
  return id;
}

bool Engine::cancel(int64_t id) {
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->admitted.count(id)) return false;
    impl_->cancels.push_back(id);
  }
  impl_->wake.notify_all();
  return true;
}

void Engine::drain() {
  std::unique_lock lock(impl_->mutex);
  impl_->draining = true;
  impl_->idle.wait(lock, [&] { return impl_->admitted.empty(); });
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

bool Engine::healthy() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->healthy;
}

int64_t Engine::max_model_len() const { return impl_->max_model_len; }

GenerationResult generate_blocking(Engine& engine, GenerationRequest request) {
  auto done = std::make_shared<std::promise<void>>();
  auto result = std::make_shared<GenerationResult>();
  std::future<void> ready = done->get_future();
  const bool want_logprobs = request.logprobs >= 0;
  engine.submit(std::move(request), [done, result, want_logprobs](const GenerationEvent& ev) {
    if (ev.token >= 0) {
      result->tokens.push_back(ev.token);
      if (want_logprobs) result->logprobs.push_back(ev.logprob);
    }
    if (ev.finished) {
      result->finish_reason = ev.finish_reason;
      result->error = ev.error;
      done->set_value();
    }
  });
  ready.wait();
  return std::move(*result);
}

std::vector<GenerationResult> generate_all_blocking(Engine& engine, std::vector<GenerationRequest> requests) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable done;
    size_t remaining = 0;
    std::vector<GenerationResult> results;
  };
  auto shared = std::make_shared<Shared>();
  shared->results.resize(requests.size());
  shared->remaining = requests.size();
  for (size_t i = 0; i < requests.size(); ++i) {
    const bool want_logprobs = requests[i].logprobs >= 0;
    engine.submit(std::move(requests[i]), [shared, i, want_logprobs](const GenerationEvent& ev) {
      GenerationResult& r = shared->results[i];
      if (ev.token >= 0) {
        r.tokens.push_back(ev.token);
        if (want_logprobs) r.logprobs.push_back(ev.logprob);
      }
      if (!ev.finished) return;
      r.finish_reason = ev.finish_reason;
      r.error = ev.error;
      std::lock_guard lock(shared->mutex);
      if (--shared->remaining == 0) shared->done.notify_all();
    });
  }
  std::unique_lock lock(shared->mutex);
  shared->done.wait(lock, [&] { return shared->remaining == 0; });
  return std::move(shared->results);
}

}  // namespace kiln
