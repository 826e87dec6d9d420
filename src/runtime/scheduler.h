// Iteration-level (continuous) batching with chunked prefill and preemption by recompute, in the
// manner of vLLM v1's Scheduler and nano-vllm's scheduler.py. Pure logic: no GPU or model calls.
//
// The engine thread owns it (it is not thread-safe) and drives one step at a time:
//
//   StepPlan plan = scheduler.schedule();           // who runs which tokens, with block tables
//   ... forward(plan) on a backend, sample the chunks with needs_logits ...
//   auto finished = scheduler.on_step_done(tokens);  // always called, even for an empty plan
//
// Policy, per step (each rule cited where it comes from):
//  1. FCFS priority by submission order. Strict head-of-line admission keeps an invariant that
//     check_invariants() proves: every running request arrived before every waiting one. So "the
//     most recently admitted running request" (vLLM's and nano-vllm's preemption victim) is always
//     the newest one, and the oldest request is never preempted in favour of a newer one.
//  2. Decodes of running requests first (oldest first, one token each): they are cheap and keep
//     inter-token latency flat (Sarathi-Serve's "decode-maximal" batching, vLLM's chunked prefill).
//  3. Then the prefill chunk of the running request that is mid-prompt (or recomputing after
//     preemption), with the remaining budget. FCFS makes it the newest running request, so there
//     is at most one.
//  4. Then admission from the waiting queue, FCFS, while budget, max_num_seqs and free blocks
//     allow; blocks are allocated only for the tokens computed this step (vLLM v1). A request
//     whose chunk does not fit blocks the queue (no overtaking). No admission in a step that
//     preempted (vLLM v1), which avoids thrashing.
//  5. A decode that needs a block when none is free preempts the newest running request (freeing
//     its blocks; it goes to the front of the waiting queue and later recomputes prompt + generated
//     tokens, so its output is unchanged); when it is the newest itself, it preempts itself (vLLM).
//     A prefill chunk never preempts: it shrinks to the free blocks, or waits a step.
//  6. Opt-in (prefill_first, vLLM v0's order; a throughput knob for offline batches): while a
//     prompt waits and fits, a step runs prefill work only (rule 3's chunk, then rule 4's
//     admissions, each admission leaving a free block for every running request's next decode),
//     and the running requests' decodes wait; when nothing can be admitted the step is rules 2-4.
//     Every request then reaches the decode phase sooner and the decode steps run full, at the cost
//     of stalling the running requests while prompts are admitted. Not after a step that preempted
//     (the victim would be readmitted at once, to be preempted again).
// The oldest request computes at least one token every step (with prefill_first: at least once in
// every run of prefill-only steps, which admission bounds by max_num_seqs and the prompts' chunks):
// as a decode it may preempt everyone
// newer (the budget, >= max_num_seqs, always covers every decode), and mid-prefill it is also the
// newest, so it runs alone; submit() rejects any request that could not fit in the whole pool
// alone. So nothing hangs and nothing starves: scheduler_trace_test checks this every step.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/batch_window.h"
#include "runtime/block_manager.h"
#include "runtime/request_state.h"
#include "runtime/step_plan.h"

namespace kiln {

struct SchedulerConfig {
  int32_t num_kv_blocks = 0;  // the pool (the backend decides how many fit in memory)
  int32_t block_size = 16;    // tokens per KV block
  int32_t max_num_seqs = 256;  // most requests running at once (vLLM's max_num_seqs)
  int64_t max_batched_tokens = 2048;  // token budget per step; must be >= max_num_seqs (as vLLM)
  int64_t max_model_len = 0;  // most tokens (prompt + max_new_tokens) per request; 0: the pool's size
  bool prefill_first = false;  // rule 6 above (--prefill-first)
  BatchWindow batch_window;

  // Throws kiln::Error(invalid_argument) naming the first bad field.
  void validate() const;
};

class Scheduler {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Scheduler(const SchedulerConfig& config);

  // Queues a request at the back of the waiting queue. Throws invalid_argument, changing nothing,
  // for an empty prompt, a negative token id, max_new_tokens < 1 (or not above generated.size()),
  // a duplicate id, or prompt + max_new_tokens beyond max_model_len or the whole KV pool (a request
  // that could never run is rejected now rather than left waiting forever).
  void submit(RequestSpec spec);
  // Drops a request in any state and frees its blocks; false when the id is unknown (never
  // submitted, or already finished: a client may cancel just as its request ends). A request
  // whose step is in flight leaves the queues at once (status `finished`), but its blocks are freed
  // and its id released by on_step_done, since the running forward may still write them.
  bool cancel(RequestId id);

  // Plans the next step (see the policy above). Throws internal if the previous step is still open.
  StepPlan schedule();
  // Closes the step: the K/V of every planned chunk are now cached; `sampled` has exactly one
  // token per chunk that needed logits (requests cancelled meanwhile may be included or not).
  // Appends the tokens, finishes requests (stop flag or max_new_tokens) and frees their blocks.
  // Throws invalid_argument, changing nothing, when `sampled` does not match the plan.
  std::vector<FinishedRequest> on_step_done(std::span<const SampledToken> sampled);

  // The batching window (batch_window.h) applied to the current queues.
  bool should_wait(Clock::time_point now) const;

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  bool step_in_flight() const { return step_open_; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  int64_t num_preemptions() const { return preemptions_total_; }
  const SchedulerConfig& config() const { return config_; }
  const BlockManager& block_manager() const { return blocks_; }
  // nullopt once a request has finished or been cancelled (or for an unknown id); `finished` only
  // for a request cancelled while its step is in flight.
  std::optional<RequestStatus> status(RequestId id) const;
  const RequestState* find(RequestId id) const;

  // Throws internal on any broken invariant (block accounting, queue order, FCFS partition,
  // cache coverage). O(requests + blocks); for tests and debug builds.
  void check_invariants() const;

 private:
  struct StepDraft;  // the step being planned (scheduler.cpp)

  void schedule_decodes(StepDraft& draft);
  void schedule_running_prefill(StepDraft& draft);
  // reserve_for_decodes: admit only while a free block is left for every running request (rule 6).
  void admit_waiting(StepDraft& draft, bool reserve_for_decodes = false);
  void preempt_newest(StepDraft& draft);
  // Preempts newer requests until `request` holds total_tokens; false when it is the newest and
  // the blocks still do not suffice.
  bool make_room(RequestState& request, int64_t total_tokens, StepDraft& draft);
  int64_t tokens_that_fit(const RequestState& request, int64_t wanted) const;
  StepPlan build_plan(const StepDraft& draft);
  // Pair every in-flight chunk with its token (InFlight::sampled). The first is the engine's case
  // (tokens in plan order, one pass, no maps) and only says whether it applies; the second takes
  // any order and throws invalid_argument on a bad answer. Neither changes any request.
  bool match_in_plan_order(std::span<const SampledToken> sampled);
  void match_any_order(std::span<const SampledToken> sampled);
  void finish(RequestState& request, FinishReason reason, std::vector<FinishedRequest>& finished);

  SchedulerConfig config_;
  BlockManager blocks_;
  std::unordered_map<RequestId, RequestState> requests_;  // node-based: pointers stay valid
  std::deque<RequestState*> waiting_;                     // oldest first; preempted ones in front
  std::vector<RequestState*> running_;                    // oldest first
  uint64_t next_arrival_ = 0;
  int64_t preemptions_total_ = 0;
  bool preempted_last_step_ = false;  // rule 6 waits a step after a preemption

  // The open step: what each chunk computes, so on_step_done can commit it. `request` stays valid
  // until then: a request cancelled meanwhile is kept (status finished) until on_step_done.
  struct InFlight {
    RequestId id;
    RequestState* request;
    int64_t n_tokens;
    bool needs_logits;
    const SampledToken* sampled = nullptr;  // its token, once on_step_done has matched it
  };
  bool step_open_ = false;
  std::vector<InFlight> in_flight_;
};

}  // namespace kiln
