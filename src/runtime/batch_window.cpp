#include "runtime/batch_window.h"

namespace kiln {

bool should_wait_for_batch(const BatchWindow& window, size_t num_waiting, size_t num_running,
                           std::chrono::steady_clock::time_point oldest_arrival,
                           std::chrono::steady_clock::time_point now) {
  if (num_running > 0 || num_waiting == 0) return false;
  if (window.target_batch_size > 0 && num_waiting >= size_t(window.target_batch_size)) return false;
  return now < oldest_arrival + window.min_batch_wait;
}

}  // namespace kiln
