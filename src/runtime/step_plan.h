// What passes between the scheduler and the engine step: the plan of one forward pass, the
// statistics of that step, the sampled tokens that come back, and the requests that finished.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/request_state.h"

namespace kiln {

// One sequence's share of a step. Positions first_position ... first_position + tokens.size() - 1
// are computed; their K/V go to the slots given by block_table (position p lives in block
// block_table[p / block_size], slot p % block_size), which covers every position up to the last
// one of this chunk. tokens and block_table view the StepPlan's arena: valid while the plan lives.
struct ScheduledChunk {
  RequestId id = 0;
  int64_t first_position = 0;        // = tokens already in the KV cache
  std::span<const int32_t> tokens;   // a prompt (or recompute) chunk, or the one last sampled token
  bool is_decode = false;            // one token, everything before it cached
  bool needs_logits = false;         // the chunk reaches the last known token, so a sample follows
  std::span<const int32_t> block_table;
};

struct StepStats {
  int32_t num_seqs = 0;  // chunks in the step (batch size)
  int64_t prefill_tokens = 0;  // prompt and recompute tokens
  int64_t decode_tokens = 0;
  int32_t kv_blocks_used = 0;  // after this step's allocations
  int32_t kv_blocks_total = 0;
  int32_t preemptions_this_step = 0;
  int64_t preemptions_total = 0;
  int32_t num_running = 0;  // after scheduling; may exceed num_seqs when some run out of budget
  int32_t num_waiting = 0;  // preempted ones included
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks (oldest first in each)
  StepStats stats;
  // Every chunk's tokens and block table, back to back: one allocation a step, not two a chunk
  // (thousands at a full decode batch). Moving the plan keeps the chunks' views valid; copying
  // would not, so it is move-only.
  std::vector<int32_t> arena;

  StepPlan() = default;
  StepPlan(StepPlan&&) = default;
  StepPlan& operator=(StepPlan&&) = default;
  StepPlan(const StepPlan&) = delete;
  StepPlan& operator=(const StepPlan&) = delete;

  bool empty() const { return chunks.empty(); }
  int64_t num_tokens() const { return stats.prefill_tokens + stats.decode_tokens; }
};

// The caller's answer for a chunk that needed logits. stop: the caller ends the request after this
// token (EOS, a stop string or id); max_new_tokens is enforced by the scheduler itself.
struct SampledToken {
  RequestId id = 0;
  int32_t token = 0;
  bool stop = false;
};

enum class FinishReason { stop, length };  // OpenAI's finish_reason values; cancel returns nothing
const char* finish_reason_name(FinishReason reason);

struct FinishedRequest {
  RequestId id = 0;
  FinishReason reason = FinishReason::stop;
  std::vector<int32_t> output;  // every generated token, the last (stop) one included
};

}  // namespace kiln
