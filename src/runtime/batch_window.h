// The batching window: whether an idle engine should hold its next step a little so that more
// requests arrive and share it (like vLLM's scheduler_delay_factor or TGI's waiting_served_ratio,
// reduced to two numbers). Pure logic on a time argument, so tests never sleep.
//
// The window only applies when nothing is running: once a batch runs, new requests join it at the
// next step anyway (that is continuous batching), and holding a step would only delay the
// running requests' tokens.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace kiln {

struct BatchWindow {
  std::chrono::milliseconds min_batch_wait{0};  // 0: never wait
  int32_t target_batch_size = 1;                // stop waiting once this many requests wait
};

// True when the engine should sleep (at most until oldest_arrival + min_batch_wait) before
// scheduling: nothing runs, something waits, fewer than the target wait, and the oldest waiting
// request has waited less than min_batch_wait.
bool should_wait_for_batch(const BatchWindow& window, size_t num_waiting, size_t num_running,
                           std::chrono::steady_clock::time_point oldest_arrival,
                           std::chrono::steady_clock::time_point now);

}  // namespace kiln
