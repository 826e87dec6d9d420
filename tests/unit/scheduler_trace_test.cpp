// The scheduler over long traces, driving the fake paged model (fake_paged_model.h): exact block
// accounting every step, budgets, no starvation, and outputs identical to each request run alone
// despite chunking, batching, preemption and cancellation.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "fake_paged_model.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kNoEos = -1;  // the hash never yields it: every request runs to max_new_tokens

// Runs steps and checks, after each one, everything that must always hold. Request ids must grow
// with submission order (the tests' live_ map then lists the oldest first).
class TraceHarness {
 public:
  TraceHarness(const SchedulerConfig& config, int32_t eos)
      : scheduler(config), model(config.num_kv_blocks, config.block_size, kVocab, eos), config_(config), eos_(eos) {}

  void submit(RequestSpec spec) {
    scheduler.submit(spec);
    live_.emplace(spec.id, std::move(spec));
  }

  void cancel(RequestId id) {
    EXPECT_TRUE(scheduler.cancel(id));
    live_.erase(id);
    ++cancelled;
  }

  // One engine step; the requests in cancel_in_flight are cancelled while the forward "runs".
  void step(const std::vector<RequestId>& cancel_in_flight = {}) {
    ++steps;
    const bool had_work = scheduler.has_work();
    // No starvation: the oldest live request computes at least one token every step.
    const RequestState* oldest = live_.empty() ? nullptr : scheduler.find(live_.begin()->first);
    const RequestId oldest_id = oldest ? oldest->id : -1;
    const int64_t oldest_computed = oldest ? oldest->num_computed : 0;

    StepPlan plan = scheduler.schedule();
    check_plan(plan, had_work);
    for (const auto& [id, spec] : live_)
      if (scheduler.status(id) == RequestStatus::preempted) ever_preempted.insert(id);
    for (RequestId id : cancel_in_flight)
      if (live_.contains(id)) cancel(id);

    for (auto& done : scheduler.on_step_done(model.forward(plan))) {
      auto it = live_.find(done.id);
      ASSERT_NE(it, live_.end()) << "request " << done.id << " finished twice or after cancel";
      test::AloneResult alone = test::generate_alone(it->second.prompt, it->second.max_new_tokens, kVocab, eos_);
      EXPECT_EQ(done.output, alone.output) << "request " << done.id << " (preempted: " << ever_preempted.count(done.id)
                                           << ") differs from its run alone";
      EXPECT_EQ(done.reason, alone.reason) << "request " << done.id;
      finished_at[done.id] = steps;
      live_.erase(it);
    }
    if (oldest && live_.contains(oldest_id)) {
      // Every step, or (prefill_first) within max_stall_steps of prefill-only steps.
      stall_ = oldest_id == stalled_id_ ? stall_ : 0;
      stalled_id_ = oldest_id;
      stall_ = scheduler.find(oldest_id)->num_computed > oldest_computed ? 0 : stall_ + 1;
      EXPECT_LE(stall_, max_stall_steps) << "the oldest request " << oldest_id << " made no progress for " << stall_
                                         << " steps, up to step " << steps;
    }
    scheduler.check_invariants();
    check_exact_accounting();
  }

  void drain(int max_steps) {
    for (int i = 0; i < max_steps && scheduler.has_work() && !::testing::Test::HasFailure(); ++i) step();
    EXPECT_FALSE(scheduler.has_work()) << "not drained after " << max_steps << " steps";
    EXPECT_TRUE(live_.empty());
    EXPECT_EQ(scheduler.block_manager().num_free_blocks(), scheduler.block_manager().num_blocks());
    EXPECT_EQ(scheduler.block_manager().num_sequences(), 0u);
  }

  const std::map<RequestId, RequestSpec>& live() const { return live_; }

  Scheduler scheduler;
  test::FakePagedModel model;
  int64_t steps = 0;
  int64_t cancelled = 0;
  int64_t mid_prompt_chunks = 0;  // chunks that stopped short of the last known token
  int64_t max_batch = 0;
  std::set<RequestId> ever_preempted;
  std::map<RequestId, int64_t> finished_at;  // step of finishing
  int64_t max_stall_steps = 0;  // steps the oldest request may go without progress (prefill_first)

 private:
  void check_plan(const StepPlan& plan, bool had_work) {
    if (had_work) {
      EXPECT_FALSE(plan.empty()) << "work left but nothing scheduled (a hang)";
    }
    EXPECT_LE(plan.num_tokens(), config_.max_batched_tokens);
    EXPECT_LE(plan.chunks.size(), size_t(config_.max_num_seqs));
    EXPECT_EQ(plan.stats.num_seqs, int32_t(plan.chunks.size()));
    EXPECT_EQ(plan.stats.kv_blocks_used, scheduler.block_manager().num_used_blocks());
    int64_t tokens = 0;
    bool seen_prefill = false;
    std::set<RequestId> ids;
    for (const auto& chunk : plan.chunks) {
      EXPECT_TRUE(ids.insert(chunk.id).second) << "request " << chunk.id << " twice in one step";
      EXPECT_FALSE(chunk.is_decode && seen_prefill) << "a decode after a prefill chunk";
      seen_prefill |= !chunk.is_decode;
      const RequestState* state = scheduler.find(chunk.id);
      ASSERT_NE(state, nullptr);
      ASSERT_FALSE(chunk.tokens.empty());
      const int64_t end = chunk.first_position + int64_t(chunk.tokens.size());
      EXPECT_EQ(chunk.first_position, state->num_computed);
      EXPECT_TRUE(std::equal(chunk.tokens.begin(), chunk.tokens.end(), state->tokens.begin() + chunk.first_position));
      EXPECT_EQ(chunk.needs_logits, end == state->num_tokens());
      EXPECT_GE(int64_t(chunk.block_table.size()) * config_.block_size, end);
      auto table = scheduler.block_manager().block_table(chunk.id);
      EXPECT_TRUE(std::equal(table.begin(), table.end(), chunk.block_table.begin(), chunk.block_table.end()));
      // vLLM v1: a step that had to preempt admits nobody (admitted chunks start at position 0).
      EXPECT_FALSE(plan.stats.preemptions_this_step > 0 && chunk.first_position == 0)
          << "request " << chunk.id << " admitted in a step that preempted";
      tokens += int64_t(chunk.tokens.size());
      mid_prompt_chunks += !chunk.needs_logits;
    }
    EXPECT_EQ(tokens, plan.num_tokens());
    max_batch = std::max<int64_t>(max_batch, int64_t(plan.chunks.size()));
  }

  // Free blocks + distinct blocks held == the pool, and no block is held twice (the scheduler
  // never forks), recounted from the live requests.
  void check_exact_accounting() {
    const BlockManager& blocks = scheduler.block_manager();
    std::set<int32_t> used;
    size_t held = 0;
    for (const auto& [id, spec] : live_) {
      if (!blocks.contains(id)) continue;
      auto table = blocks.block_table(id);
      used.insert(table.begin(), table.end());
      held += table.size();
    }
    EXPECT_EQ(blocks.num_free_blocks() + int32_t(used.size()), blocks.num_blocks());
    EXPECT_EQ(held, used.size());
  }

  SchedulerConfig config_;
  int32_t eos_;
  RequestId stalled_id_ = -1;
  int64_t stall_ = 0;
  std::map<RequestId, RequestSpec> live_;  // submitted, neither finished nor cancelled
};

SchedulerConfig config_of(int32_t blocks, int32_t block_size, int32_t max_num_seqs, int64_t max_batched_tokens) {
  SchedulerConfig config;
  config.num_kv_blocks = blocks;
  config.block_size = block_size;
  config.max_num_seqs = max_num_seqs;
  config.max_batched_tokens = max_batched_tokens;
  return config;
}

RequestSpec random_request(RequestId id, std::mt19937& rng, int64_t prompt_max, int64_t new_max, int64_t limit) {
  RequestSpec spec;
  spec.id = id;
  int64_t prompt_len = 1 + int64_t(rng() % uint64_t(prompt_max));
  for (int64_t i = 0; i < prompt_len; ++i) spec.prompt.push_back(int32_t(rng() % kVocab));
  spec.max_new_tokens = std::min<int64_t>(1 + int64_t(rng() % uint64_t(new_max)), limit - prompt_len);
  return spec;
}

// Thousands of steps of random arrivals, finishes (EOS or length) and cancellations (queued,
// running, preempted, and mid-step) in a pool too small for the load, for three fixed seeds.
// With prefill_first (scheduler.h, rule 6) too: the oldest request then waits at most while
// max_num_seqs requests are admitted, each in up to ceil(60 / 24) = 3 chunks.
TEST(SchedulerTrace, RandomMixKeepsBlocksExactAndOutputsIdentical) {
  for (const bool prefill_first : {false, true}) {
    for (const uint32_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " prefill_first " << prefill_first);
      auto config = config_of(40, 4, 6, 24);  // 160 tokens of KV
      config.prefill_first = prefill_first;
      TraceHarness trace(config, /*eos=*/0);
      trace.max_stall_steps = prefill_first ? 6 * 3 : 0;
      std::mt19937 rng(seed);
      RequestId next_id = 0;
      for (int i = 0; i < 3000 && !HasFailure(); ++i) {
        if (rng() % 100 < 20) trace.submit(random_request(next_id++, rng, 60, 80, 160));
        auto random_live = [&] { return std::next(trace.live().begin(), long(rng() % trace.live().size()))->first; };
        if (rng() % 100 < 3 && !trace.live().empty()) trace.cancel(random_live());
        std::vector<RequestId> mid_step;
        if (rng() % 100 < 3 && !trace.live().empty()) mid_step.push_back(random_live());
        trace.step(mid_step);
      }
      trace.drain(20000);
      EXPECT_GT(trace.finished_at.size(), 300u);
      EXPECT_GT(trace.cancelled, 100);
      EXPECT_GT(trace.ever_preempted.size(), 30u);
      EXPECT_GT(trace.scheduler.num_preemptions(), 30);
      EXPECT_GT(trace.mid_prompt_chunks, 100);
      EXPECT_EQ(trace.max_batch, config.max_num_seqs);
    }
  }
}

// The reliability checklist's KV exhaustion case: room for two long sequences, 32 submitted at
// once. All complete with exact token counts and exactly the tokens they produce alone.
TEST(SchedulerTrace, KvExhaustionPreemptsAndEveryoneCompletesExactly) {
  for (bool prefill_first : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "prefill_first " << prefill_first);
    auto config = config_of(30, 4, 8, 32);  // 120 tokens: two of 20 + 40
    config.prefill_first = prefill_first;
    TraceHarness trace(config, kNoEos);
    trace.max_stall_steps = prefill_first ? 8 : 0;
    std::mt19937 rng(99);
    for (RequestId id = 0; id < 32; ++id) {
      RequestSpec spec;
      spec.id = id;
      for (int i = 0; i < 20; ++i) spec.prompt.push_back(int32_t(rng() % kVocab));
      spec.max_new_tokens = 40;
      trace.submit(spec);
    }
    trace.drain(5000);
    EXPECT_EQ(trace.finished_at.size(), 32u);  // outputs (40 tokens each) checked at every finish
    if (!prefill_first) {
      EXPECT_GT(trace.ever_preempted.size(), 4u);  // rule 6 keeps blocks for decodes: fewer or none
    }
  }
}

// A steady stream of short requests, with a long request (most of the pool) every 150 steps. FCFS
// admission and newest-first preemption mean the stream never starves a long one: once a long
// request is the oldest live one it computes a token every step (the harness checks), so it
// finishes within prompt + max_new_tokens steps of that; from submission, within the total work
// of the requests older than it plus its own.
TEST(SchedulerTrace, ShortRequestStreamNeverStarvesOldLongOnes) {
  const auto config = config_of(32, 4, 4, 8);  // 128 tokens of KV, 8 tokens per step
  TraceHarness trace(config, kNoEos);
  std::mt19937 rng(7);
  struct Long {
    int64_t submitted = 0;
    int64_t bound = 0;  // steps
    int64_t oldest_since = -1;
  };
  std::map<RequestId, Long> longs;
  RequestId next_id = 0;
  for (int i = 0; i < 3000 && !HasFailure(); ++i) {
    if (i % 150 == 10) {
      RequestSpec spec;
      spec.id = next_id++;
      for (int t = 0; t < 48; ++t) spec.prompt.push_back(int32_t(rng() % kVocab));
      spec.max_new_tokens = 60;  // 108 of the pool's 128 tokens
      int64_t bound = 48 + 60;
      for (const auto& [id, older] : trace.live()) bound += int64_t(older.prompt.size()) + older.max_new_tokens;
      longs[spec.id] = {trace.steps, bound, -1};
      trace.submit(spec);
    }
    if (rng() % 100 < 30) trace.submit(random_request(next_id++, rng, 8, 10, 128));
    for (auto& [id, info] : longs)
      if (info.oldest_since < 0 && !trace.live().empty() && trace.live().begin()->first == id)
        info.oldest_since = trace.steps;
    trace.step();
  }
  trace.drain(20000);
  ASSERT_EQ(longs.size(), 20u);
  for (const auto& [id, info] : longs) {
    ASSERT_TRUE(trace.finished_at.contains(id)) << "long request " << id;
    int64_t finished = trace.finished_at.at(id);
    EXPECT_LE(finished - info.submitted, info.bound) << "long request " << id;
    if (info.oldest_since >= 0) {
      EXPECT_LE(finished - info.oldest_since, 48 + 60) << "long request " << id;
    }
  }
  EXPECT_GT(trace.finished_at.size(), 500u);  // the stream itself kept flowing
}

}  // namespace
}  // namespace kiln
