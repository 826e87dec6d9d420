// What the scheduler knows about one request: the caller's spec, and the state it tracks while
// the request waits, runs, is preempted and finishes.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace kiln {

using RequestId = int64_t;

struct RequestSpec {
  RequestId id = 0;  // chosen by the caller; unique among the scheduler's live requests
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 0;      // cap on generated tokens, `generated` included
  std::vector<int32_t> generated;  // tokens already generated (a resumed request); usually empty
  // Only the batching window reads it (see batch_window.h); order comes from submission order.
  std::chrono::steady_clock::time_point arrival_time{};
};

// preempted: back in the waiting queue (at its front) after losing its KV blocks; it recomputes
// prompt + generated tokens when readmitted. Finished requests leave the scheduler, so `finished`
// is only seen in FinishedRequest and while a cancelled request's step is still in flight.
enum class RequestStatus { waiting, running, preempted, finished };
const char* request_status_name(RequestStatus status);

struct RequestState {
  RequestId id = 0;
  std::vector<int32_t> tokens;  // every known token: prompt, then generated
  int64_t prompt_len = 0;
  int64_t max_new_tokens = 0;
  int64_t num_computed = 0;  // leading tokens whose K/V are in the cache
  RequestStatus status = RequestStatus::waiting;
  uint64_t arrival = 0;  // submission order: the FCFS priority, lower is older
  std::chrono::steady_clock::time_point arrival_time{};
  int32_t num_preemptions = 0;

  int64_t num_tokens() const { return int64_t(tokens.size()); }
  int64_t num_generated() const { return num_tokens() - prompt_len; }
  int64_t num_uncomputed() const { return num_tokens() - num_computed; }
  // Decoding: everything but the last sampled token is in the cache. A prompt (or a recompute
  // after preemption) is a prefill even when one token is left.
  bool is_decoding() const { return num_generated() > 0 && num_uncomputed() == 1; }
};

}  // namespace kiln
