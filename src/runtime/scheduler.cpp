#include "runtime/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace kiln {

const char* request_status_name(RequestStatus status) {
  switch (status) {
    case RequestStatus::waiting: return "waiting";
    case RequestStatus::running: return "running";
    case RequestStatus::preempted: return "preempted";
    case RequestStatus::finished: return "finished";
  }
  return "?";
}

const char* finish_reason_name(FinishReason reason) { return reason == FinishReason::stop ? "stop" : "length"; }

void SchedulerConfig::validate() const {
  KILN_CHECK(num_kv_blocks > 0, invalid_argument, "num_kv_blocks must be positive, got {}", num_kv_blocks);
  KILN_CHECK(block_size > 0, invalid_argument, "block_size must be positive, got {}", block_size);
  KILN_CHECK(max_num_seqs > 0, invalid_argument, "max_num_seqs must be positive, got {}", max_num_seqs);
  // As vLLM requires: with fewer tokens than sequences, a full batch of decodes could not run.
  KILN_CHECK(max_batched_tokens >= max_num_seqs, invalid_argument,
             "max_batched_tokens ({}) must be at least max_num_seqs ({})", max_batched_tokens, max_num_seqs);
  KILN_CHECK(max_model_len >= 0, invalid_argument, "max_model_len must not be negative, got {}", max_model_len);
  KILN_CHECK(batch_window.min_batch_wait.count() >= 0 && batch_window.target_batch_size >= 0, invalid_argument,
             "batch window: min_batch_wait ({} ms) and target_batch_size ({}) must not be negative",
             batch_window.min_batch_wait.count(), batch_window.target_batch_size);
}

namespace {
const SchedulerConfig& validated(const SchedulerConfig& config) {
  config.validate();
  return config;
}
}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(validated(config)), blocks_(config.num_kv_blocks, config.block_size) {}

// ---- requests in and out ----------------------------------------------------------------------

void Scheduler::submit(RequestSpec spec) {
  const RequestId id = spec.id;
  KILN_CHECK(!requests_.contains(id), invalid_argument, "request id {} is already in use", id);
  KILN_CHECK(!spec.prompt.empty(), invalid_argument, "request {}: the prompt is empty", id);
  KILN_CHECK(spec.max_new_tokens >= 1, invalid_argument, "request {}: max_new_tokens must be at least 1, got {}", id,
             spec.max_new_tokens);
  KILN_CHECK(int64_t(spec.generated.size()) < spec.max_new_tokens, invalid_argument,
             "request {}: {} tokens are already generated, max_new_tokens {} leaves none to generate", id,
             spec.generated.size(), spec.max_new_tokens);
  for (const auto* part : {&spec.prompt, &spec.generated})
    for (int32_t token : *part) KILN_CHECK(token >= 0, invalid_argument, "request {}: negative token id {}", id, token);

  // Reject now what could never run: the request alone must fit in the context and in the pool.
  const int64_t pool = blocks_.pool_capacity_tokens();
  const bool context_binds = config_.max_model_len > 0 && config_.max_model_len < pool;
  const int64_t limit = context_binds ? config_.max_model_len : pool;
  const int64_t prompt_len = int64_t(spec.prompt.size());
  KILN_CHECK(prompt_len <= limit && spec.max_new_tokens <= limit - prompt_len, invalid_argument,
             "request {}: prompt ({} tokens) + max_new_tokens ({}) exceeds {} of {} tokens; shorten the prompt or "
             "lower max_new_tokens",
             id, prompt_len, spec.max_new_tokens,
             context_binds ? "the model's context (max_model_len)" : "the whole KV cache", limit);

  RequestState state;
  state.id = id;
  state.tokens = std::move(spec.prompt);
  state.tokens.insert(state.tokens.end(), spec.generated.begin(), spec.generated.end());
  state.prompt_len = prompt_len;
  state.max_new_tokens = spec.max_new_tokens;
  state.arrival = next_arrival_++;
  state.arrival_time = spec.arrival_time;
  RequestState& stored = requests_.emplace(id, std::move(state)).first->second;
  waiting_.push_back(&stored);
}

bool Scheduler::cancel(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.status == RequestStatus::finished) return false;
  RequestState& request = it->second;
  if (request.status == RequestStatus::running) {
    running_.erase(std::find(running_.begin(), running_.end(), &request));
    bool in_flight = step_open_ && std::any_of(in_flight_.begin(), in_flight_.end(),
                                               [&](const InFlight& f) { return f.id == id; });
    if (in_flight) {
      request.status = RequestStatus::finished;  // on_step_done frees the blocks and the id
      return true;
    }
    blocks_.free(id);
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &request));  // holds no blocks
  }
  requests_.erase(it);
  return true;
}

// Frees its blocks and reports it; on_step_done then drops every finished request from running_
// and requests_ in one pass (a find + erase each is quadratic when a whole batch ends together).
void Scheduler::finish(RequestState& request, FinishReason reason, std::vector<FinishedRequest>& finished) {
  blocks_.free(request.id);
  finished.push_back({request.id, reason,
                      std::vector<int32_t>(request.tokens.begin() + request.prompt_len, request.tokens.end())});
  request.status = RequestStatus::finished;
}

// ---- planning a step --------------------------------------------------------------------------

struct Scheduler::StepDraft {
  struct Pick {
    RequestState* request;
    int64_t n_tokens;
    // Its block table, final for the step: nothing grows a request's table after it is picked,
    // and changes to other tables (preemption, admission) leave this view valid.
    std::span<const int32_t> table;
  };
  std::vector<Pick> picks;  // in plan order
  int64_t budget = 0;       // tokens left this step
  int32_t preemptions = 0;
};

StepPlan Scheduler::schedule() {
  KILN_CHECK(!step_open_, internal, "schedule() called again before on_step_done() closed the previous step");
  StepDraft draft;
  draft.picks.reserve(std::min(running_.size() + waiting_.size(), size_t(config_.max_num_seqs)));
  draft.budget = config_.max_batched_tokens;
  if (config_.prefill_first && !preempted_last_step_) {  // rule 6: prefill work only, if there is any
    schedule_running_prefill(draft);
    admit_waiting(draft, /*reserve_for_decodes=*/true);
  }
  if (draft.picks.empty()) {
    schedule_decodes(draft);
    schedule_running_prefill(draft);
    admit_waiting(draft);
  }
  preempted_last_step_ = draft.preemptions > 0;
  StepPlan plan = build_plan(draft);
  step_open_ = true;
  return plan;
}

// Preempt-by-recompute of the newest running request (vLLM's and nano-vllm's victim: the most
// recently admitted, which FCFS admission makes the newest). Its K/V are dropped; its tokens are
// kept, so readmission recomputes them and sampling continues where it stopped.
void Scheduler::preempt_newest(StepDraft& draft) {
  RequestState* victim = running_.back();
  running_.pop_back();
  // Only decodes preempt, oldest first, so every victim is newer than anything planned so far.
  KILN_CHECK(std::none_of(draft.picks.begin(), draft.picks.end(),
                          [&](const StepDraft::Pick& p) { return p.request == victim; }),
             internal, "scheduler: preempting request {}, already planned this step", victim->id);
  blocks_.free(victim->id);
  victim->num_computed = 0;
  victim->status = RequestStatus::preempted;
  ++victim->num_preemptions;
  ++draft.preemptions;
  ++preemptions_total_;
  waiting_.push_front(victim);  // victims go newest first, so the queue stays oldest first
}

bool Scheduler::make_room(RequestState& request, int64_t total_tokens, StepDraft& draft) {
  while (blocks_.blocks_needed(request.id, total_tokens) > blocks_.num_free_blocks()) {
    if (running_.back() == &request) return false;  // nothing newer left to preempt
    preempt_newest(draft);
  }
  return true;
}

int64_t Scheduler::tokens_that_fit(const RequestState& request, int64_t wanted) const {
  int64_t room = blocks_.capacity_tokens(request.id) + int64_t(blocks_.num_free_blocks()) * blocks_.block_size() -
                 request.num_computed;
  return std::clamp<int64_t>(room, 0, wanted);
}

void Scheduler::schedule_decodes(StepDraft& draft) {
  // Index loop: preemption only removes requests newer than running_[i], i.e. after it.
  for (size_t i = 0; i < running_.size() && draft.budget > 0; ++i) {
    RequestState& request = *running_[i];
    if (!request.is_decoding()) continue;
    const int64_t total = request.num_computed + 1;
    // One table lookup per decode: only one step in block_size needs a new block.
    std::span<const int32_t> table = blocks_.block_table(request.id);
    if (int64_t(table.size()) * blocks_.block_size() < total) {
      if (!make_room(request, total, draft)) {
        preempt_newest(draft);  // it is the newest itself: give its blocks to the older ones (vLLM)
        break;
      }
      table = blocks_.ensure_capacity(request.id, total);
    }
    draft.picks.push_back({&request, 1, table});
    --draft.budget;
  }
}

void Scheduler::schedule_running_prefill(StepDraft& draft) {
  // FCFS admission leaves at most one running request mid-prefill (mid-prompt, or recomputing
  // after preemption), and it is the newest: its chunk took the rest of the budget or of the free
  // blocks, so nobody was admitted after it (check_invariants proves it). So it never preempts
  // anyone: its chunk shrinks to the free blocks, and with none free it waits a step holding its
  // blocks; only older requests hold the rest, and they progress.
  if (running_.empty() || draft.budget == 0) return;
  RequestState& request = *running_.back();
  if (request.is_decoding()) return;  // planned above
  const int64_t n = tokens_that_fit(request, std::min(request.num_uncomputed(), draft.budget));
  if (n == 0) return;
  draft.picks.push_back({&request, n, blocks_.ensure_capacity(request.id, request.num_computed + n)});
  draft.budget -= n;
}

void Scheduler::admit_waiting(StepDraft& draft, bool reserve_for_decodes) {
  if (draft.preemptions > 0) return;  // vLLM v1: a step that had to preempt admits nobody
  while (!waiting_.empty() && draft.budget > 0 && running_.size() < size_t(config_.max_num_seqs)) {
    RequestState& request = *waiting_.front();
    const int64_t chunk = std::min(request.num_tokens(), draft.budget);
    // Rule 6 keeps a block for the next decode of every running request, this one included.
    const int64_t reserve = reserve_for_decodes ? int64_t(running_.size()) + 1 : 0;
    if (blocks_.blocks_for_tokens(chunk) + reserve > blocks_.num_free_blocks())
      break;  // FCFS: nobody overtakes the head of the queue
    waiting_.pop_front();
    std::span<const int32_t> table = blocks_.allocate(request.id, chunk);
    request.status = RequestStatus::running;
    running_.push_back(&request);
    draft.picks.push_back({&request, chunk, table});
    draft.budget -= chunk;
  }
}

StepPlan Scheduler::build_plan(const StepDraft& draft) {
  StepPlan plan;
  size_t arena_size = 0;
  for (const auto& pick : draft.picks) arena_size += size_t(pick.n_tokens) + pick.table.size();
  plan.arena.resize(arena_size);  // sized once, so the views taken below never move
  int32_t* out = plan.arena.data();
  auto append = [&out](std::span<const int32_t> from) {
    std::span<const int32_t> view(out, from.size());
    out = std::copy(from.begin(), from.end(), out);
    return view;
  };
  plan.chunks.reserve(draft.picks.size());
  in_flight_.clear();
  in_flight_.reserve(draft.picks.size());
  for (const auto& [request, n, table] : draft.picks) {
    ScheduledChunk chunk;
    chunk.id = request->id;
    chunk.first_position = request->num_computed;
    chunk.tokens = append(std::span(request->tokens).subspan(size_t(request->num_computed), size_t(n)));
    chunk.is_decode = request->is_decoding();
    chunk.needs_logits = request->num_computed + n == request->num_tokens();
    chunk.block_table = append(table);
    (chunk.is_decode ? plan.stats.decode_tokens : plan.stats.prefill_tokens) += n;
    in_flight_.push_back({chunk.id, request, n, chunk.needs_logits});
    plan.chunks.push_back(chunk);
  }
  StepStats& stats = plan.stats;
  stats.num_seqs = int32_t(plan.chunks.size());
  stats.kv_blocks_used = blocks_.num_used_blocks();
  stats.kv_blocks_total = blocks_.num_blocks();
  stats.preemptions_this_step = draft.preemptions;
  stats.preemptions_total = preemptions_total_;
  stats.num_running = int32_t(running_.size());
  stats.num_waiting = int32_t(waiting_.size());
  return plan;
}

// ---- closing a step ---------------------------------------------------------------------------

std::vector<FinishedRequest> Scheduler::on_step_done(std::span<const SampledToken> sampled) {
  KILN_CHECK(step_open_, internal, "on_step_done() called without a step from schedule()");
  // Check everything before changing anything, so a bad answer leaves the step open and intact.
  if (!match_in_plan_order(sampled)) match_any_order(sampled);

  std::vector<FinishedRequest> finished;
  for (const auto& f : in_flight_) {
    RequestState& request = *f.request;
    if (request.status == RequestStatus::finished) {  // cancelled while the forward ran
      blocks_.free(f.id);
      requests_.erase(f.id);
      continue;
    }
    request.num_computed += f.n_tokens;
    if (!f.needs_logits) continue;
    const SampledToken& s = *f.sampled;
    request.tokens.push_back(s.token);
    if (s.stop)
      finish(request, FinishReason::stop, finished);
    else if (request.num_generated() >= request.max_new_tokens)
      finish(request, FinishReason::length, finished);
  }
  if (!finished.empty()) {
    std::erase_if(running_, [](const RequestState* r) { return r->status == RequestStatus::finished; });
    for (const FinishedRequest& f : finished) requests_.erase(f.id);
  }
  in_flight_.clear();
  step_open_ = false;
  return finished;
}

// Accepts only what match_any_order would accept, paired the same way (ids are unique in a plan);
// anything else, wrong or merely out of order, is left to match_any_order.
bool Scheduler::match_in_plan_order(std::span<const SampledToken> sampled) {
  size_t next = 0;
  for (InFlight& f : in_flight_) {
    f.sampled = nullptr;
    if (!f.needs_logits) continue;
    if (next < sampled.size() && sampled[next].id == f.id) {
      if (sampled[next].token < 0) return false;
      f.sampled = &sampled[next++];
    } else if (f.request->status != RequestStatus::finished) {  // only a cancelled chunk may lack one
      return false;
    }
  }
  return next == sampled.size();
}

void Scheduler::match_any_order(std::span<const SampledToken> sampled) {
  std::unordered_map<RequestId, InFlight*> planned;
  for (InFlight& f : in_flight_) {
    f.sampled = nullptr;
    planned.emplace(f.id, &f);
  }
  for (const auto& s : sampled) {
    auto it = planned.find(s.id);
    KILN_CHECK(it != planned.end(), invalid_argument, "step results: request {} was not in the step", s.id);
    InFlight& f = *it->second;
    KILN_CHECK(f.needs_logits, invalid_argument,
               "step results: request {} got a token, but its chunk ended before its last known token", s.id);
    KILN_CHECK(f.sampled == nullptr, invalid_argument, "step results: two tokens for request {}", s.id);
    KILN_CHECK(s.token >= 0, invalid_argument, "step results: request {} sampled negative token id {}", s.id, s.token);
    f.sampled = &s;
  }
  for (const InFlight& f : in_flight_) {
    bool cancelled = f.request->status == RequestStatus::finished;
    KILN_CHECK(!f.needs_logits || cancelled || f.sampled, invalid_argument,
               "step results: no token for request {}, whose chunk needed logits", f.id);
  }
}

// ---- observers --------------------------------------------------------------------------------

bool Scheduler::should_wait(Clock::time_point now) const {
  if (waiting_.empty()) return false;
  return should_wait_for_batch(config_.batch_window, waiting_.size(), running_.size(), waiting_.front()->arrival_time,
                               now);
}

const RequestState* Scheduler::find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

std::optional<RequestStatus> Scheduler::status(RequestId id) const {
  const RequestState* request = find(id);
  return request ? std::optional(request->status) : std::nullopt;
}

void Scheduler::check_invariants() const {
  blocks_.check_invariants();
  KILN_CHECK(running_.size() <= size_t(config_.max_num_seqs), internal, "scheduler: {} running > max_num_seqs {}",
             running_.size(), config_.max_num_seqs);
  size_t cancelled_in_flight = 0;
  for (const auto& [id, request] : requests_) {
    KILN_CHECK(request.num_generated() < request.max_new_tokens || request.status == RequestStatus::finished,
               internal, "scheduler: request {} is live with {} of {} tokens generated", id, request.num_generated(),
               request.max_new_tokens);
    if (request.status == RequestStatus::finished) {
      ++cancelled_in_flight;
      KILN_CHECK(step_open_ && blocks_.contains(id), internal,
                 "scheduler: cancelled request {} kept outside an open step", id);
    }
  }
  const RequestState* previous = nullptr;
  for (const RequestState* request : running_) {
    KILN_CHECK(request->status == RequestStatus::running, internal, "scheduler: request {} in running is {}",
               request->id, request_status_name(request->status));
    KILN_CHECK(!previous || previous->arrival < request->arrival, internal, "scheduler: running out of FCFS order");
    KILN_CHECK(blocks_.capacity_tokens(request->id) >= request->num_computed, internal,
               "scheduler: request {} has {} tokens cached in blocks for {}", request->id, request->num_computed,
               blocks_.capacity_tokens(request->id));
    KILN_CHECK(step_open_ || request->num_uncomputed() >= 1, internal,
               "scheduler: running request {} has nothing to compute", request->id);
    KILN_CHECK(step_open_ || request->is_decoding() || request == running_.back(), internal,
               "scheduler: request {} is mid-prefill but not the newest running request", request->id);
    previous = request;
  }
  for (const RequestState* request : waiting_) {
    KILN_CHECK(request->status == RequestStatus::waiting || request->status == RequestStatus::preempted, internal,
               "scheduler: request {} in waiting is {}", request->id, request_status_name(request->status));
    KILN_CHECK(!previous || previous->arrival < request->arrival, internal,
               "scheduler: request {} breaks FCFS order (every running request must be older than every waiting one)",
               request->id);
    KILN_CHECK(request->num_computed == 0 && !blocks_.contains(request->id), internal,
               "scheduler: waiting request {} holds KV blocks", request->id);
    previous = request;
  }
  KILN_CHECK(requests_.size() == running_.size() + waiting_.size() + cancelled_in_flight, internal,
             "scheduler: {} requests but {} running + {} waiting + {} cancelled", requests_.size(), running_.size(),
             waiting_.size(), cancelled_in_flight);
  KILN_CHECK(blocks_.num_sequences() == running_.size() + cancelled_in_flight, internal,
             "scheduler: {} block tables for {} running + {} cancelled requests", blocks_.num_sequences(),
             running_.size(), cancelled_in_flight);
}

}  // namespace kiln
