// One choice of a completion as the engine's events arrive: token ids -> UTF-8-safe text
// (StreamingDetokenizer) -> stop strings (StopMatcher) -> deltas that are safe to send. The
// streamed deltas concatenate to exactly the text a non-streamed response carries.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "kiln/engine.h"
#include "server/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

struct LogprobItem {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top;
  size_t text_offset = 0;  // bytes of choice text before this token
};

struct ChoiceDelta {
  std::string text;
  std::vector<LogprobItem> logprobs;
  bool finished = false;  // this event ended the choice (see ChoiceState::finish_reason)
};

class ChoiceState {
 public:
  // Tokens in `no_text_ids` (end of generation, stop_token_ids) count but add no text, as vLLM
  // skips special tokens.
  ChoiceState(const Tokenizer& tokenizer, std::vector<std::string> stops, bool include_stop,
              const std::unordered_set<int32_t>& no_text_ids, bool keep_logprobs);

  // Takes one engine event. Events after the choice finished are ignored.
  ChoiceDelta push(const GenerationEvent& event);

  bool finished() const { return finished_; }
  // "stop" (end of generation, stop token, stop string), "length", "error", "cancelled".
  const std::string& finish_reason() const { return finish_reason_; }
  const std::string& error() const { return error_; }
  // A stop string ended the choice before the engine did: the engine request must be cancelled.
  bool stopped_by_string() const { return matcher_.matched(); }
  const std::string& matched_stop() const { return matcher_.matched_stop(); }
  int64_t completion_tokens() const { return completion_tokens_; }
  const std::string& text() const { return text_; }
  const std::vector<LogprobItem>& logprobs() const { return logprobs_; }

 private:
  StopMatcher matcher_;
  StreamingDetokenizer detok_;
  const std::unordered_set<int32_t>& no_text_ids_;
  bool keep_logprobs_;
  bool finished_ = false;
  std::string finish_reason_, error_, text_;
  int64_t completion_tokens_ = 0;
  std::vector<LogprobItem> logprobs_;
};

// A token's text for logprobs: its bytes with invalid UTF-8 replaced by U+FFFD.
std::string token_text(const Tokenizer& tokenizer, int32_t id);

}  // namespace kiln::server
