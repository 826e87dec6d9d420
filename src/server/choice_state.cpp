#include "server/choice_state.h"

#include "tokenizer/utf8.h"

namespace kiln::server {

ChoiceState::ChoiceState(const Tokenizer& tokenizer, std::vector<std::string> stops, bool include_stop,
                         const std::unordered_set<int32_t>& no_text_ids, bool keep_logprobs)
    : matcher_(std::move(stops), include_stop), detok_(tokenizer), no_text_ids_(no_text_ids),
      keep_logprobs_(keep_logprobs) {}

ChoiceDelta ChoiceState::push(const GenerationEvent& ev) {
  ChoiceDelta d;
  if (finished_) return d;
  if (ev.token >= 0) {
    ++completion_tokens_;
    if (keep_logprobs_) {
      LogprobItem item{ev.token, ev.logprob, ev.top_logprobs, text_.size()};
      d.logprobs.push_back(item);
      logprobs_.push_back(std::move(item));
    }
    if (!no_text_ids_.count(ev.token)) d.text = matcher_.push(detok_.push(ev.token));
  }
  if (matcher_.matched()) {
    finished_ = true;
    finish_reason_ = "stop";
  } else if (ev.finished) {
    finished_ = true;
    d.text += matcher_.push(detok_.flush());
    if (matcher_.matched()) {
      finish_reason_ = "stop";
    } else {
      d.text += matcher_.finish();
      finish_reason_ = ev.finish_reason;
      error_ = ev.error;
    }
  }
  d.finished = finished_;
  text_ += d.text;
  return d;
}

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  std::string out;
  utf8::append_replacing_invalid(out, tokenizer.token_bytes(id), true);
  return out;
}

}  // namespace kiln::server
