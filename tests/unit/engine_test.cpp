// The serving engine on the CPU backend (tiny random model): batch invariance, KV exhaustion with
// preemption, cancellation, per-request validation, drain.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include "expect_error.h"
#include "kiln/engine.h"
#include "tiny_model.h"

namespace kiln {
namespace {

using test::expect_error;

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> prompt_of(int i, int len) {
  std::vector<int32_t> p;
  for (int j = 0; j < len; ++j) p.push_back(int32_t((i * 31 + j * 7 + 3) % 97));
  return p;
}


TEST(Engine, GreedyTokensAreTheSameAloneAndInBatchesOf2To64) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  EngineOptions o;
  o.num_kv_blocks = 1024;
  o.max_num_seqs = 64;
  o.max_batched_tokens = 256;
  Engine engine(*backend, o);
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 64; ++i) alone.push_back(generate_blocking(engine, greedy(prompt_of(i, 5 + i % 13), 12)).tokens);
  for (int batch : {2, 7, 64}) {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < batch; ++i) requests.push_back(greedy(prompt_of(i, 5 + i % 13), 12));
    const auto results = generate_all_blocking(engine, requests);
    for (int i = 0; i < batch; ++i) {
      EXPECT_EQ(results[size_t(i)].tokens, alone[size_t(i)]) << "request " << i << " in a batch of " << batch;
      EXPECT_EQ(results[size_t(i)].finish_reason, "length");
    }
  }
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST(Engine, KvExhaustionPreemptsAndEveryRequestCompletesExactly) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  EngineOptions o;
  o.block_size = 4;
  o.num_kv_blocks = 30;  // 120 tokens: room for two sequences of 20 + 40
  o.max_num_seqs = 32;
  o.max_batched_tokens = 64;
  Engine engine(*backend, o);
  std::vector<std::vector<int32_t>> alone;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 32; ++i) {
    requests.push_back(greedy(prompt_of(i, 20), 40));
    alone.push_back(generate_blocking(engine, requests.back()).tokens);
  }
  const auto results = generate_all_blocking(engine, requests);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(results[size_t(i)].tokens.size(), 40u) << i;
    EXPECT_EQ(results[size_t(i)].tokens, alone[size_t(i)]) << "request " << i << " after preemption";
  }
  const EngineStats s = engine.stats();
  EXPECT_GT(s.preemptions_total, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_TRUE(s.healthy);
}

TEST(Engine, CancelEndsTheRequestAndFreesItsBlocks) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  EngineOptions o;
  o.num_kv_blocks = 256;
  Engine engine(*backend, o);
  std::promise<std::string> reason;
  std::atomic<int> tokens{0};
  std::atomic<int64_t> id{0};
  std::atomic<bool> cancelled{false};
  id = engine.submit(greedy(prompt_of(1, 8), 1000), [&](const GenerationEvent& ev) {
    // The engine may emit before submit() has returned the id to this thread: wait for it.
    while (id.load() == 0) std::this_thread::yield();
    if (ev.token >= 0 && ++tokens == 3 && !cancelled.exchange(true)) engine.cancel(id);  // from the callback itself
    if (ev.finished) reason.set_value(ev.finish_reason);
  });
  EXPECT_EQ(reason.get_future().get(), "cancelled");
  EXPECT_LT(tokens.load(), 10);
  for (int i = 0; i < 100 && engine.stats().kv_blocks_used != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  EXPECT_FALSE(engine.cancel(id));  // already gone
  EXPECT_FALSE(engine.cancel(12345));
}

TEST(Engine, BadRequestsAreRejectedAtSubmitAndOthersAreUnaffected) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  EngineOptions o;
  o.num_kv_blocks = 64;
  o.block_size = 4;  // 256 tokens of pool: the max context is 256
  Engine engine(*backend, o);
  auto ignore = [](const GenerationEvent&) {};
  expect_error([&] { engine.submit(greedy({}, 4), ignore); }, "prompt is empty", Errc::invalid_argument);
  expect_error([&] { engine.submit(greedy({1, 97}, 4), ignore); }, "outside the vocabulary", Errc::invalid_argument);
  expect_error([&] { engine.submit(greedy({1, 2}, 0), ignore); }, "max_tokens", Errc::invalid_argument);
  GenerationRequest nan_temp = greedy({1, 2}, 4);
  nan_temp.sampling.temperature = std::nanf("");
  expect_error([&] { engine.submit(nan_temp, ignore); }, "temperature", Errc::invalid_argument);
  expect_error([&] { engine.submit(greedy(prompt_of(0, 300), 4), ignore); }, "300 tokens", Errc::invalid_argument);
  GenerationRequest lp = greedy({1, 2}, 4);
  lp.logprobs = 21;
  expect_error([&] { engine.submit(lp, ignore); }, "logprobs", Errc::invalid_argument);
  // max_tokens beyond the context is capped, as vLLM does.
  const GenerationResult capped = generate_blocking(engine, greedy(prompt_of(0, 250), 100));
  EXPECT_EQ(capped.tokens.size(), 6u);
  EXPECT_EQ(capped.finish_reason, "length");
  EXPECT_TRUE(engine.healthy());
}

TEST(Engine, StopTokensLogprobsAndSampling) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  EngineOptions o;
  o.num_kv_blocks = 256;
  Engine engine(*backend, o);
  GenerationRequest r = greedy(prompt_of(2, 6), 20);
  r.logprobs = 3;
  std::vector<GenerationEvent> events;
  std::promise<void> done;
  engine.submit(r, [&](const GenerationEvent& ev) {
    events.push_back(ev);
    if (ev.finished) done.set_value();
  });
  done.get_future().wait();
  ASSERT_EQ(events.size(), 20u);
  for (const auto& ev : events) {
    ASSERT_EQ(ev.top_logprobs.size(), 3u);
    EXPECT_EQ(ev.top_logprobs[0].token, ev.token);  // greedy picks the most likely token
    EXPECT_FLOAT_EQ(ev.top_logprobs[0].logprob, ev.logprob);
    EXPECT_LE(ev.logprob, 0.0f);
    EXPECT_GE(ev.top_logprobs[0].logprob, ev.top_logprobs[1].logprob);
  }
  // A stop id ends the request with "stop", the id itself emitted last.
  GenerationRequest s = greedy(prompt_of(2, 6), 20);
  s.stop_token_ids = {events[4].token};
  const GenerationResult stopped = generate_blocking(engine, s);
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.tokens.back(), events[4].token);
  EXPECT_LE(stopped.tokens.size(), 5u);
  // end_of_generation ids stop unless ignore_eos.
  // Seeded sampling is reproducible.
  GenerationRequest t = greedy(prompt_of(3, 6), 16);
  t.sampling.temperature = 1.0f;
  t.sampling.top_k = 0;
  t.sampling.top_p = 1.0f;
  t.sampling.min_p = 0;
  t.sampling.seed = 42;
  EXPECT_EQ(generate_blocking(engine, t).tokens, generate_blocking(engine, t).tokens);
}

TEST(Engine, EndOfGenerationIdsStopUnlessIgnored) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  EngineOptions o;
  o.num_kv_blocks = 256;
  Engine probe(*backend, o);
  const auto free_run = generate_blocking(probe, greedy(prompt_of(4, 6), 10)).tokens;
  o.end_of_generation = {free_run[3]};
  Engine engine(*backend, o);
  GenerationRequest r = greedy(prompt_of(4, 6), 10);
  r.ignore_eos = false;
  const GenerationResult stopped = generate_blocking(engine, r);
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.tokens.back(), free_run[3]);
  r.ignore_eos = true;
  EXPECT_EQ(generate_blocking(engine, r).tokens, free_run);
}

TEST(Engine, DrainWaitsForRunningRequestsThenRefusesNewOnes) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  EngineOptions o;
  o.num_kv_blocks = 256;
  Engine engine(*backend, o);
  std::atomic<int> finished{0};
  for (int i = 0; i < 4; ++i)
    engine.submit(greedy(prompt_of(i, 5), 30), [&](const GenerationEvent& ev) { finished += ev.finished; });
  engine.drain();
  EXPECT_EQ(finished.load(), 4);
  expect_error([&] { engine.submit(greedy({1}, 1), [](const GenerationEvent&) {}); }, "shutting down",
               Errc::unavailable);
}

TEST(Engine, StepTraceHasOneLinePerStepAndStatsSplitForwardFromHostTime) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  EngineOptions o;
  o.num_kv_blocks = 64;
  o.max_num_seqs = 4;
  o.max_batched_tokens = 8;
  o.step_trace_path = ::testing::TempDir() + "kiln_step_trace.csv";
  // The first step waits for both requests (else it may start with the first one alone).
  o.batch_wait = std::chrono::milliseconds(10000);
  o.target_batch_size = 2;
  int64_t steps = 0;
  EngineStats s;
  {
    Engine engine(*backend, o);
    // 2 prompts of 6 tokens, budget 8: step 1 = prompt 0 + 2 tokens of prompt 1, step 2 = decode 0 +
    // the last 4 of prompt 1, then decodes until each has 3 tokens (request 1 one step later).
    const auto results = generate_all_blocking(engine, {greedy(prompt_of(0, 6), 3), greedy(prompt_of(1, 6), 3)});
    EXPECT_EQ(results[0].tokens.size(), 3u);
    s = engine.stats();
    steps = s.steps_total;
  }
  EXPECT_EQ(steps, 4);
  EXPECT_GT(s.forward_seconds_total, 0);
  EXPECT_GE(s.host_seconds_total, 0);
  std::FILE* f = std::fopen(o.step_trace_path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::vector<std::string> lines;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) lines.emplace_back(buf);
  std::fclose(f);
  ASSERT_EQ(lines.size(), size_t(steps) + 1);
  EXPECT_EQ(lines[0].rfind("step,chunks,decode_tokens,prefill_tokens,sampled,", 0), 0u);
  EXPECT_EQ(lines[1].rfind("1,2,0,8,1,", 0), 0u) << lines[1];  // prompt 0 whole, 2 tokens of prompt 1
  EXPECT_EQ(lines[2].rfind("2,2,1,4,2,", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("3,2,2,0,2,", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4].rfind("4,1,1,0,1,", 0), 0u) << lines[4];  // request 0 ended after its 3rd token
}

}  // namespace
}  // namespace kiln
