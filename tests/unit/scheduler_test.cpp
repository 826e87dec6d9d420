// The scheduler's rules one at a time, on hand-traced small cases. Randomized traces, starvation
// and the fake model are in scheduler_trace_test.cpp.
#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "expect_error.h"

namespace kiln {
namespace {

using test::expect_error;
using namespace std::chrono_literals;

SchedulerConfig config_of(int32_t blocks, int32_t block_size, int32_t max_num_seqs, int64_t max_batched_tokens) {
  SchedulerConfig config;
  config.num_kv_blocks = blocks;
  config.block_size = block_size;
  config.max_num_seqs = max_num_seqs;
  config.max_batched_tokens = max_batched_tokens;
  return config;
}

RequestSpec request(RequestId id, int64_t prompt_len, int64_t max_new_tokens) {
  RequestSpec spec;
  spec.id = id;
  for (int64_t i = 0; i < prompt_len; ++i) spec.prompt.push_back(int32_t(id * 100 + i));
  spec.max_new_tokens = max_new_tokens;
  return spec;
}

// One token (the same id) for every chunk that asked for logits.
std::vector<SampledToken> sample_all(const StepPlan& plan, int32_t token = 7) {
  std::vector<SampledToken> out;
  for (const auto& chunk : plan.chunks)
    if (chunk.needs_logits) out.push_back({chunk.id, token, false});
  return out;
}

std::vector<FinishedRequest> step(Scheduler& s, int32_t token = 7) {
  StepPlan plan = s.schedule();
  auto finished = s.on_step_done(sample_all(plan, token));
  s.check_invariants();
  return finished;
}

// A chunk's tokens view its plan's arena; a copy compares with EXPECT_EQ.
std::vector<int32_t> tokens_of(const ScheduledChunk& chunk) { return {chunk.tokens.begin(), chunk.tokens.end()}; }

const ScheduledChunk* chunk_of(const StepPlan& plan, RequestId id) {
  for (const auto& chunk : plan.chunks)
    if (chunk.id == id) return &chunk;
  return nullptr;
}

TEST(SchedulerConfig, RejectsImpossibleSettings) {
  expect_error([] { Scheduler(config_of(0, 16, 4, 64)); }, "num_kv_blocks", Errc::invalid_argument);
  expect_error([] { Scheduler(config_of(8, 0, 4, 64)); }, "block_size", Errc::invalid_argument);
  expect_error([] { Scheduler(config_of(8, 16, 0, 64)); }, "max_num_seqs", Errc::invalid_argument);
  expect_error([] { Scheduler(config_of(8, 16, 8, 4)); }, "at least max_num_seqs", Errc::invalid_argument);
  auto config = config_of(8, 16, 4, 64);
  config.batch_window.min_batch_wait = -1ms;
  expect_error([&] { Scheduler{config}; }, "min_batch_wait", Errc::invalid_argument);
}

TEST(Scheduler, OneRequestPrefillsThenDecodesThenFinishesByLength) {
  Scheduler s(config_of(16, 4, 4, 16));
  s.submit(request(1, 6, 3));
  EXPECT_EQ(s.status(1), RequestStatus::waiting);

  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  const ScheduledChunk& prefill = plan.chunks[0];
  EXPECT_EQ(prefill.first_position, 0);
  EXPECT_EQ(tokens_of(prefill), request(1, 6, 3).prompt);
  EXPECT_TRUE(prefill.needs_logits);
  EXPECT_FALSE(prefill.is_decode);
  EXPECT_EQ(prefill.block_table.size(), 2u);  // 6 tokens in blocks of 4
  EXPECT_EQ(plan.stats.prefill_tokens, 6);
  EXPECT_EQ(plan.stats.decode_tokens, 0);
  EXPECT_EQ(plan.stats.kv_blocks_used, 2);
  EXPECT_EQ(plan.stats.kv_blocks_total, 16);
  EXPECT_EQ(plan.stats.num_running, 1);
  EXPECT_TRUE(s.on_step_done(std::vector<SampledToken>{{1, 42, false}}).empty());
  EXPECT_EQ(s.status(1), RequestStatus::running);

  plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].first_position, 6);
  EXPECT_EQ(tokens_of(plan.chunks[0]), std::vector<int32_t>{42});
  EXPECT_TRUE(plan.chunks[0].is_decode);
  EXPECT_TRUE(plan.chunks[0].needs_logits);
  EXPECT_EQ(plan.stats.decode_tokens, 1);
  EXPECT_TRUE(s.on_step_done(std::vector<SampledToken>{{1, 43, false}}).empty());

  plan = s.schedule();
  EXPECT_EQ(plan.chunks[0].first_position, 7);
  EXPECT_EQ(plan.chunks[0].block_table.size(), 2u);  // position 7 still fits in 2 blocks
  auto finished = s.on_step_done(std::vector<SampledToken>{{1, 44, false}});
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].id, 1);
  EXPECT_EQ(finished[0].reason, FinishReason::length);
  EXPECT_EQ(finished[0].output, (std::vector<int32_t>{42, 43, 44}));
  EXPECT_EQ(s.status(1), std::nullopt);
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(s.block_manager().num_free_blocks(), 16);
  s.check_invariants();
}

TEST(Scheduler, StopFlagFinishesWithReasonStop) {
  Scheduler s(config_of(16, 4, 4, 16));
  s.submit(request(1, 3, 50));
  s.on_step_done(sample_all(s.schedule()));
  s.schedule();
  auto finished = s.on_step_done(std::vector<SampledToken>{{1, 2, true}});
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].reason, FinishReason::stop);
  EXPECT_EQ(finished[0].output, (std::vector<int32_t>{7, 2}));
  EXPECT_EQ(s.block_manager().num_free_blocks(), 16);
}

TEST(Scheduler, ChunkedPrefillSplitsALongPromptWithinTheBudget) {
  Scheduler s(config_of(16, 4, 4, 16));
  s.submit(request(1, 40, 2));
  const int64_t expected_first[] = {0, 16, 32};
  const size_t expected_len[] = {16, 16, 8};
  const size_t expected_blocks[] = {4, 8, 10};
  for (int i = 0; i < 3; ++i) {
    StepPlan plan = s.schedule();
    ASSERT_EQ(plan.chunks.size(), 1u);
    const auto& chunk = plan.chunks[0];
    EXPECT_EQ(chunk.first_position, expected_first[i]);
    EXPECT_EQ(chunk.tokens.size(), expected_len[i]);
    EXPECT_EQ(chunk.block_table.size(), expected_blocks[i]);
    EXPECT_EQ(chunk.needs_logits, i == 2);  // logits only once the chunk reaches the prompt's end
    EXPECT_LE(plan.num_tokens(), 16);
    s.on_step_done(sample_all(plan));
    s.check_invariants();
  }
  EXPECT_EQ(s.find(1)->num_generated(), 1);
}

TEST(Scheduler, DecodesGoFirstAndPrefillTakesTheRestOfTheBudget) {
  Scheduler s(config_of(32, 4, 4, 16));
  s.submit(request(1, 4, 10));
  step(s);
  s.submit(request(2, 40, 1));
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, 1);
  EXPECT_TRUE(plan.chunks[0].is_decode);
  EXPECT_EQ(plan.chunks[1].id, 2);
  EXPECT_EQ(plan.chunks[1].tokens.size(), 15u);
  EXPECT_FALSE(plan.chunks[1].needs_logits);
  EXPECT_EQ(plan.num_tokens(), 16);
  EXPECT_EQ(plan.stats.num_seqs, 2);
}

// Rule 6: waiting prompts are admitted in a step of their own while the running decode waits;
// the decodes of all three come next.
TEST(Scheduler, PrefillFirstAdmitsBeforeTheRunningDecode) {
  auto config = config_of(64, 4, 4, 8);
  config.prefill_first = true;
  Scheduler s(config);
  s.submit(request(1, 4, 10));
  step(s);
  s.submit(request(2, 4, 10));
  s.submit(request(3, 4, 10));
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, 2);
  EXPECT_EQ(plan.chunks[1].id, 3);
  EXPECT_EQ(plan.stats.decode_tokens, 0);
  s.on_step_done(sample_all(plan));
  s.check_invariants();
  plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 3u);
  EXPECT_EQ(plan.stats.decode_tokens, 3);
  EXPECT_EQ(plan.chunks[0].id, 1);
  s.on_step_done(sample_all(plan));
}

// Rule 6 admits only while a block is left for every running request's next decode; a prompt that
// does not leave one waits for the ordinary step (decodes first, then admission without the reserve).
TEST(Scheduler, PrefillFirstKeepsABlockForEveryRunningDecode) {
  auto config = config_of(6, 4, 4, 16);
  config.prefill_first = true;
  Scheduler s(config);
  s.submit(request(1, 6, 10));  // 2 blocks, room for 2 decodes
  step(s);
  s.submit(request(2, 6, 10));  // 2 blocks + 2 reserved (requests 1 and 2) of the 4 free: admitted
  s.submit(request(3, 4, 10));  // 1 block + 3 reserved of the 2 left: waits
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].id, 2);
  s.on_step_done(sample_all(plan));
  s.check_invariants();
  plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 3u);
  EXPECT_TRUE(plan.chunks[0].is_decode);
  EXPECT_TRUE(plan.chunks[1].is_decode);
  EXPECT_EQ(plan.chunks[2].id, 3);
  EXPECT_FALSE(plan.chunks[2].is_decode);
  s.on_step_done(sample_all(plan));
  s.check_invariants();
}

TEST(Scheduler, MaxNumSeqsCapsTheRunningSet) {
  Scheduler s(config_of(32, 4, 2, 16));
  for (RequestId id = 1; id <= 3; ++id) s.submit(request(id, 2, 5));
  StepPlan plan = s.schedule();
  EXPECT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.stats.num_waiting, 1);
  EXPECT_EQ(s.status(3), RequestStatus::waiting);
}

TEST(Scheduler, AdmissionNeedsBlocksForTheChunkAndNobodyOvertakes) {
  Scheduler s(config_of(4, 4, 4, 32));
  s.submit(request(1, 12, 4));  // 3 of the 4 blocks
  s.submit(request(2, 8, 1));   // needs 2: must wait
  s.submit(request(3, 2, 1));   // would fit in the last block, but must not overtake request 2
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].id, 1);
  EXPECT_EQ(s.num_waiting(), 2u);
  EXPECT_EQ(s.block_manager().num_free_blocks(), 1);
  s.on_step_done(sample_all(plan));
}

// Two requests share a 4-block pool until the older one needs a third block: the newer one is
// preempted, waits, and is readmitted to recompute its prompt and generated tokens.
TEST(Scheduler, PreemptsTheNewestAndRecomputesItLater) {
  Scheduler s(config_of(4, 4, 4, 16));
  s.submit(request(1, 4, 8));
  s.submit(request(2, 4, 8));
  int32_t token = 50;
  for (int i = 0; i < 5; ++i) step(s, token++);  // 8 tokens cached each: the pool is full
  ASSERT_EQ(s.find(2)->num_computed, 8);
  ASSERT_EQ(s.block_manager().num_free_blocks(), 0);

  StepPlan plan = s.schedule();  // request 1 needs a third block
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].id, 1);
  EXPECT_EQ(plan.stats.preemptions_this_step, 1);
  EXPECT_EQ(plan.stats.preemptions_total, 1);
  EXPECT_EQ(s.status(2), RequestStatus::preempted);
  EXPECT_EQ(s.find(2)->num_computed, 0);
  EXPECT_EQ(s.find(2)->num_tokens(), 9);  // its generated tokens are kept
  s.on_step_done(sample_all(plan, token++));
  s.check_invariants();

  const std::vector<int32_t> expected = s.find(2)->tokens;  // prompt + 5 generated
  for (int i = 0; i < 20 && s.status(2) != RequestStatus::running; ++i) {
    plan = s.schedule();
    if (const ScheduledChunk* recompute = chunk_of(plan, 2)) {
      EXPECT_EQ(recompute->first_position, 0);
      EXPECT_EQ(tokens_of(*recompute), expected);
      EXPECT_TRUE(recompute->needs_logits);
    }
    s.on_step_done(sample_all(plan, token++));
    s.check_invariants();
  }
  EXPECT_EQ(s.status(2), RequestStatus::running);
  EXPECT_EQ(s.status(1), std::nullopt);  // the older one finished first
}

TEST(Scheduler, ResumedRequestComputesItsGeneratedTokensFirst) {
  Scheduler s(config_of(16, 4, 4, 16));
  RequestSpec spec = request(1, 3, 3);
  spec.generated = {5, 6};
  s.submit(spec);
  StepPlan plan = s.schedule();
  EXPECT_EQ(tokens_of(plan.chunks[0]), (std::vector<int32_t>{100, 101, 102, 5, 6}));
  auto finished = s.on_step_done(sample_all(plan, 9));
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].output, (std::vector<int32_t>{5, 6, 9}));
  EXPECT_EQ(finished[0].reason, FinishReason::length);
}

TEST(Scheduler, RejectsAtSubmitWhatCouldNeverRun) {
  auto config = config_of(8, 4, 4, 16);  // 32 tokens in the pool
  Scheduler s(config);
  expect_error([&] { s.submit(request(1, 0, 4)); }, "prompt is empty", Errc::invalid_argument);
  expect_error([&] { s.submit(request(1, 4, 0)); }, "max_new_tokens must be at least 1", Errc::invalid_argument);
  expect_error([&] { s.submit(request(1, 30, 3)); }, "exceeds the whole KV cache of 32 tokens",
               Errc::invalid_argument);
  expect_error([&] { s.submit(request(1, 33, 1)); }, "prompt (33 tokens)", Errc::invalid_argument);
  expect_error([&] { s.submit(request(1, 4, INT64_MAX)); }, "exceeds", Errc::invalid_argument);
  RequestSpec negative = request(1, 4, 4);
  negative.prompt[2] = -1;
  expect_error([&] { s.submit(negative); }, "negative token id -1", Errc::invalid_argument);
  RequestSpec done = request(1, 4, 2);
  done.generated = {1, 2};
  expect_error([&] { s.submit(done); }, "leaves none to generate", Errc::invalid_argument);
  EXPECT_FALSE(s.has_work());  // nothing half-submitted

  s.submit(request(1, 30, 2));  // exactly the pool: accepted, and runs to the end alone
  expect_error([&] { s.submit(request(1, 4, 4)); }, "request id 1 is already in use", Errc::invalid_argument);
  std::vector<FinishedRequest> finished;
  for (int i = 0; i < 10 && finished.empty(); ++i) finished = step(s);
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].output.size(), 2u);

  config.max_model_len = 16;
  Scheduler limited(config);
  expect_error([&] { limited.submit(request(1, 10, 7)); }, "the model's context (max_model_len) of 16 tokens",
               Errc::invalid_argument);
  limited.submit(request(1, 10, 6));
}

TEST(Scheduler, CancelWaiting) {
  Scheduler s(config_of(16, 4, 1, 16));
  s.submit(request(1, 4, 4));
  s.submit(request(2, 4, 4));
  step(s);
  EXPECT_EQ(s.status(2), RequestStatus::waiting);
  EXPECT_TRUE(s.cancel(2));
  EXPECT_EQ(s.status(2), std::nullopt);
  EXPECT_EQ(s.num_waiting(), 0u);
  s.check_invariants();
}

TEST(Scheduler, CancelRunningBetweenStepsFreesAtOnce) {
  Scheduler s(config_of(16, 4, 4, 16));
  s.submit(request(1, 9, 4));
  step(s);
  EXPECT_EQ(s.block_manager().num_free_blocks(), 13);
  EXPECT_TRUE(s.cancel(1));
  EXPECT_EQ(s.block_manager().num_free_blocks(), 16);
  EXPECT_FALSE(s.has_work());
  EXPECT_FALSE(s.cancel(1));  // already gone
  EXPECT_FALSE(s.cancel(99));  // never existed
  s.check_invariants();
}

TEST(Scheduler, CancelDuringAStepFreesWhenTheStepCloses) {
  Scheduler s(config_of(16, 4, 4, 16));
  s.submit(request(1, 9, 4));
  s.submit(request(2, 4, 4));
  StepPlan plan = s.schedule();
  EXPECT_TRUE(s.cancel(1));
  EXPECT_EQ(s.status(1), RequestStatus::finished);
  EXPECT_EQ(s.block_manager().num_free_blocks(), 12);  // the forward may still write its blocks
  EXPECT_FALSE(s.cancel(1));
  expect_error([&] { s.submit(request(1, 4, 4)); }, "already in use", Errc::invalid_argument);
  s.check_invariants();

  auto finished = s.on_step_done(sample_all(plan));  // its token may still come back: ignored
  EXPECT_TRUE(finished.empty());
  EXPECT_EQ(s.status(1), std::nullopt);
  EXPECT_EQ(s.block_manager().num_free_blocks(), 15);  // request 2's one block remains
  s.check_invariants();
  s.submit(request(1, 4, 4));  // the id is free again

  // Without its token, too.
  plan = s.schedule();
  EXPECT_TRUE(s.cancel(2));
  std::vector<SampledToken> only_1 = {{1, 3, false}};
  s.on_step_done(only_1);
  s.check_invariants();
  EXPECT_EQ(s.num_running(), 1u);
}

TEST(Scheduler, CancelPreempted) {
  Scheduler s(config_of(4, 4, 4, 16));
  s.submit(request(1, 4, 8));
  s.submit(request(2, 4, 8));
  for (int i = 0; i < 10 && s.status(2) != RequestStatus::preempted; ++i) step(s);
  ASSERT_EQ(s.status(2), RequestStatus::preempted);
  int32_t free_before = s.block_manager().num_free_blocks();
  EXPECT_TRUE(s.cancel(2));
  EXPECT_EQ(s.block_manager().num_free_blocks(), free_before);  // it held none
  EXPECT_EQ(s.num_waiting(), 0u);
  s.check_invariants();
  while (s.has_work()) step(s);
  EXPECT_EQ(s.block_manager().num_free_blocks(), 4);
}

TEST(Scheduler, StepProtocolMisuseIsAnError) {
  Scheduler s(config_of(16, 4, 4, 16));
  expect_error([&] { s.on_step_done({}); }, "without a step", Errc::internal);
  s.submit(request(1, 20, 4));  // chunks of 16 then 4
  s.submit(request(2, 4, 4));
  StepPlan plan = s.schedule();
  expect_error([&] { s.schedule(); }, "before on_step_done()", Errc::internal);
  ASSERT_FALSE(chunk_of(plan, 1)->needs_logits);
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{{1, 5, false}}); }, "ended before its last known token",
               Errc::invalid_argument);
  EXPECT_TRUE(chunk_of(plan, 2) == nullptr);  // no budget left for it
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{{2, 5, false}}); }, "request 2 was not in the step",
               Errc::invalid_argument);
  s.on_step_done(sample_all(plan));  // the step is still open and intact after the bad answers
  s.check_invariants();
}

TEST(Scheduler, BadStepResultsChangeNothing) {
  Scheduler s(config_of(16, 4, 4, 16));
  s.submit(request(1, 4, 4));
  s.submit(request(2, 4, 4));
  StepPlan plan = s.schedule();
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{{1, 5, false}}); }, "no token for request 2",
               Errc::invalid_argument);
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{{1, 5, false}, {1, 6, false}, {2, 1, false}}); },
               "two tokens for request 1", Errc::invalid_argument);
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{{1, -5, false}, {2, 1, false}}); },
               "negative token id -5", Errc::invalid_argument);
  EXPECT_TRUE(s.step_in_flight());
  EXPECT_EQ(s.find(1)->num_computed, 0);
  s.on_step_done(sample_all(plan));
  EXPECT_EQ(s.find(1)->num_computed, 4);
  s.check_invariants();
}

// The engine answers in plan order, which on_step_done pairs in one pass; any other order takes
// the general check. Both must give the same result, and answers that look in order but are wrong
// must still be rejected, changing nothing.
TEST(Scheduler, StepResultsMatchByIdInAnyOrder) {
  auto run = [](bool reversed) {
    Scheduler s(config_of(32, 4, 4, 16));
    for (RequestId id = 1; id <= 3; ++id) s.submit(request(id, 3, 2));
    std::vector<FinishedRequest> finished;
    for (int32_t i = 0; i < 2; ++i) {
      StepPlan plan = s.schedule();
      std::vector<SampledToken> sampled;
      for (const auto& chunk : plan.chunks) sampled.push_back({chunk.id, int32_t(chunk.id) * 10 + i, false});
      if (reversed) std::reverse(sampled.begin(), sampled.end());
      for (auto& f : s.on_step_done(sampled)) finished.push_back(std::move(f));
      s.check_invariants();
    }
    EXPECT_EQ(s.num_running(), 0u);
    return finished;
  };
  for (bool reversed : {false, true}) {
    auto finished = run(reversed);  // all three end in the same step
    ASSERT_EQ(finished.size(), 3u);
    for (int32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(finished[size_t(i)].id, i + 1);
      EXPECT_EQ(finished[size_t(i)].output, (std::vector<int32_t>{(i + 1) * 10, (i + 1) * 10 + 1}));
    }
  }
}

TEST(Scheduler, InOrderLookalikeStepResultsAreRejected) {
  Scheduler s(config_of(16, 4, 4, 16));
  s.submit(request(1, 4, 4));
  s.submit(request(2, 20, 4));  // a chunk of 12, no logits
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  ASSERT_FALSE(plan.chunks[1].needs_logits);
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{{1, 5, false}, {2, 6, false}}); },
               "ended before its last known token", Errc::invalid_argument);
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{{1, 5, false}, {1, 6, false}}); },
               "two tokens for request 1", Errc::invalid_argument);
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{{1, 5, false}, {3, 6, false}}); },
               "request 3 was not in the step", Errc::invalid_argument);
  expect_error([&] { s.on_step_done(std::vector<SampledToken>{}); }, "no token for request 1", Errc::invalid_argument);
  EXPECT_TRUE(s.step_in_flight());
  EXPECT_EQ(s.find(1)->num_computed, 0);
  EXPECT_EQ(s.find(2)->num_computed, 0);
  s.on_step_done(std::vector<SampledToken>{{1, 5, false}});
  EXPECT_EQ(s.find(1)->num_computed, 4);
  EXPECT_EQ(s.find(2)->num_computed, 12);
  s.check_invariants();

  // A decode, the rest of 2's prompt and a new request; 2 is cancelled in flight and answered
  // for by nobody, the others out of order.
  s.submit(request(3, 4, 4));
  plan = s.schedule();
  ASSERT_EQ(plan.chunks.size(), 3u);
  EXPECT_TRUE(s.cancel(2));
  s.on_step_done(std::vector<SampledToken>{{3, 8, false}, {1, 9, false}});
  EXPECT_EQ(s.find(1)->tokens.back(), 9);
  EXPECT_EQ(s.find(3)->tokens.back(), 8);
  EXPECT_EQ(s.status(2), std::nullopt);
  s.check_invariants();
}

TEST(SchedulerBatchWindow, WaitsOnlyWhenIdleAndUnderTarget) {
  const auto t0 = std::chrono::steady_clock::time_point{} + 1h;
  BatchWindow window{10ms, 4};
  EXPECT_FALSE(should_wait_for_batch(window, 0, 0, t0, t0));        // nothing to wait for
  EXPECT_TRUE(should_wait_for_batch(window, 2, 0, t0, t0 + 5ms));   // idle, under target, young
  EXPECT_FALSE(should_wait_for_batch(window, 2, 0, t0, t0 + 10ms)); // waited long enough
  EXPECT_FALSE(should_wait_for_batch(window, 4, 0, t0, t0 + 1ms));  // target reached
  EXPECT_FALSE(should_wait_for_batch(window, 2, 3, t0, t0 + 1ms));  // never delay running requests
  EXPECT_FALSE(should_wait_for_batch(BatchWindow{}, 1, 0, t0, t0));  // default: no window

  auto config = config_of(16, 4, 4, 16);
  config.batch_window = window;
  Scheduler s(config);
  EXPECT_FALSE(s.should_wait(t0));
  RequestSpec spec = request(1, 4, 4);
  spec.arrival_time = t0;
  s.submit(spec);
  EXPECT_TRUE(s.should_wait(t0 + 9ms));
  EXPECT_FALSE(s.should_wait(t0 + 10ms));
}

}  // namespace
}  // namespace kiln
