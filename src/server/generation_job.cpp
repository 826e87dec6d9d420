#include "server/generation_job.h"

#include <fmt/format.h>

#include "kiln/error.h"
#include "server/api_error.h"
#include "server/http_session.h"

namespace kiln::server {

using nlohmann::json;

namespace {
double seconds(GenerationJob::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

GenerationJob::GenerationJob(SharedState& state, std::shared_ptr<HttpSession> session, ParsedRequest request,
                             Clock::time_point arrival)
    : state_(state), session_(std::move(session)), req_(std::move(request)), arrival_(arrival) {
  meta_ = make_meta(req_.chat, req_.model);
  size_t n = req_.prompts.size() * size_t(req_.n);
  choices_.reserve(n);
  for (size_t i = 0; i < n; ++i)
    choices_.emplace_back(*state_.model.tokenizer, req_.stop, req_.include_stop_str_in_output, state_.no_text_ids,
                          req_.want_logprobs);
  engine_done_.assign(n, false);
  timing_.resize(n);
  last_token_.assign(n, -1);
  if (req_.echo)
    for (size_t i = 0; i < n; ++i) echo_.push_back(state_.model.tokenizer->decode(req_.prompts[i / size_t(req_.n)]));
  ++state_.active_jobs;
  ++state_.metrics.http_in_flight;
}

GenerationJob::~GenerationJob() {
  --state_.active_jobs;
  --state_.metrics.http_in_flight;
}

void GenerationJob::start() {
  Engine* engine = state_.engine.load();
  for (size_t i = 0; i < choices_.size(); ++i) {
    try {
      auto self = shared_from_this();
      int64_t id = engine->submit(req_.engine_request(i), [self, i](const GenerationEvent& ev) { self->on_event(i, ev); });
      engine_ids_.push_back(id);
    } catch (const Error& e) {
      done_ = true;
      for (int64_t id : engine_ids_) engine->cancel(id);
      if (e.code() == Errc::invalid_argument) throw bad_request(e.what());
      if (e.code() == Errc::unavailable) {
        if (!engine->healthy()) throw ApiError(500, "server_error", fmt::format("the engine failed: {}", e.what()));
        ++state_.metrics.rejected_overload;
        throw overloaded(503, fmt::format("the server is overloaded: {}", e.what()));
      }
      throw ApiError(500, "server_error", e.what());
    }
  }
  if (!req_.stream) return;
  // The headers, then (chat) each choice's role chunk, or (echo) the prompt text.
  std::string head =
      "HTTP/1.1 200 OK\r\nServer: kiln\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
  if (!state_.options.allowed_origin.empty())
    head += fmt::format("Access-Control-Allow-Origin: {}\r\n", state_.options.allowed_origin);
  head += session_->keep_alive() ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  std::string events;
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (req_.chat) events += sse_event(chunk_json(meta_, int32_t(i), "", nullptr, "", true));
    else if (req_.echo) events += sse_event(chunk_json(meta_, int32_t(i), echo_[i], nullptr, "", false));
  }
  if (!events.empty()) head += fmt::format("{:x}\r\n{}\r\n", events.size(), events);
  session_->queue_write(std::move(head));
}

void GenerationJob::on_event(size_t choice, const GenerationEvent& event) {
  bool post = false;
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.emplace_back(choice, event);
    if (!drain_posted_) post = drain_posted_ = true;
  }
  if (post) boost::asio::post(session_->executor(), [self = shared_from_this()] { self->drain_inbox(); });
}

void GenerationJob::drain_inbox() {
  std::vector<std::pair<size_t, GenerationEvent>> events;
  {
    std::lock_guard lock(inbox_mu_);
    events.swap(inbox_);
    drain_posted_ = false;
  }
  auto now = Clock::now();
  std::string out;
  for (auto& [i, ev] : events) {
    if (ev.finished) engine_done_[i] = true;
    if (done_ || choices_[i].finished()) continue;
    ChoiceState& c = choices_[i];
    Timing& t = timing_[i];
    if (ev.token >= 0) {
      if (t.tokens == 0) {
        t.first = now;
        state_.metrics.ttft.observe(seconds(now - arrival_));
      } else {
        state_.metrics.itl.observe(seconds(now - t.last));
      }
      t.last = now;
      ++t.tokens;
      last_token_[i] = ev.token;
    }
    ChoiceDelta d = c.push(ev);
    if (d.finished && c.finish_reason() == "error") {
      fail(c.error().empty() ? "the engine failed while generating" : c.error());
      return;
    }
    if (req_.stream && (!d.text.empty() || !d.logprobs.empty())) {
      json lp = req_.want_logprobs ? logprobs_json(req_.chat, *state_.model.tokenizer, d.logprobs,
                                                   i < echo_.size() ? echo_[i].size() : 0)
                                   : json(nullptr);
      out += sse_event(chunk_json(meta_, int32_t(i), d.text, lp, "", false));
    }
    if (!d.finished) continue;
    ++n_finished_;
    if (c.stopped_by_string() && !engine_done_[i]) state_.engine.load()->cancel(engine_ids_[i]);
    state_.metrics.count_finish(c.finish_reason());
    state_.metrics.e2e.observe(seconds(now - arrival_));
    if (t.tokens > 0) {
      double queue = seconds(t.first - arrival_);
      state_.metrics.queue_time.observe(queue);
      if (t.tokens > 1) state_.metrics.tpot.observe(seconds(t.last - t.first) / double(t.tokens - 1));
    }
    if (req_.stream)
      out += sse_event(chunk_json(meta_, int32_t(i), "", nullptr, c.finish_reason(), false,
                                  stop_reason_json(c, last_token_[i], req_.base.stop_token_ids)));
  }
  if (req_.stream && !out.empty()) session_->queue_write(fmt::format("{:x}\r\n{}\r\n", out.size(), out));
  if (n_finished_ == choices_.size()) finish();
}

void GenerationJob::finish() {
  if (done_) return;
  done_ = true;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const auto& p : req_.prompts) prompt_tokens += int64_t(p.size());
  for (const ChoiceState& c : choices_) completion_tokens += c.completion_tokens();
  json usage = usage_json(prompt_tokens, completion_tokens);
  if (req_.stream) {
    std::string out;
    if (req_.include_usage) out += sse_event(usage_chunk_json(meta_, usage));
    out += "data: [DONE]\n\n";
    session_->queue_write(fmt::format("{:x}\r\n{}\r\n0\r\n\r\n", out.size(), out));
    session_->end_response();
  } else {
    session_->send_json(200, response_json(meta_, *state_.model.tokenizer, choices_, echo_, req_.want_logprobs, usage));
  }
}

void GenerationJob::fail(const std::string& message) {
  if (done_) return;
  done_ = true;
  cancel_running();
  ApiError err(500, "server_error", fmt::format("generation failed: {}", message));
  state_.metrics.count_finish("error");
  if (req_.stream) {
    std::string out = sse_event(err.body()) + "data: [DONE]\n\n";
    session_->queue_write(fmt::format("{:x}\r\n{}\r\n0\r\n\r\n", out.size(), out));
    session_->end_response();
  } else {
    session_->send_error(err);
  }
}

void GenerationJob::cancel_running() {
  Engine* engine = state_.engine.load();
  for (size_t i = 0; i < engine_ids_.size(); ++i)
    if (!engine_done_[i]) engine->cancel(engine_ids_[i]);
}

void GenerationJob::abandon() {
  if (done_) return;
  done_ = true;
  cancel_running();
  for (const ChoiceState& c : choices_)
    if (!c.finished()) state_.metrics.count_finish("abort");
}

}  // namespace kiln::server
