// One /v1/completions or /v1/chat/completions request in flight: its n (x prompts) engine
// requests, each choice's text pipeline (ChoiceState), and the response, streamed as SSE chunks
// or sent whole at the end. Engine events arrive on the engine thread and are handed to the
// connection's strand; everything else runs there.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/engine.h"
#include "server/choice_state.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/server_state.h"

namespace kiln::server {

class HttpSession;

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  using Clock = std::chrono::steady_clock;
  GenerationJob(SharedState& state, std::shared_ptr<HttpSession> session, ParsedRequest request,
                Clock::time_point arrival);
  ~GenerationJob();

  // Submits every engine request. Throws ApiError when the engine refuses one (nothing is left
  // running then).
  void start();
  // The client went away: cancel what still runs; nothing more is written.
  void abandon();

 private:
  struct Timing {
    Clock::time_point first, last;
    int64_t tokens = 0;
  };
  void on_event(size_t choice, const GenerationEvent& event);  // engine thread
  void drain_inbox();                                         // strand
  void finish();
  void fail(const std::string& message);
  void cancel_running();

  SharedState& state_;
  std::shared_ptr<HttpSession> session_;
  ParsedRequest req_;
  ResponseMeta meta_;
  Clock::time_point arrival_;
  std::vector<ChoiceState> choices_;
  std::vector<int64_t> engine_ids_;
  std::vector<bool> engine_done_;
  std::vector<Timing> timing_;
  std::vector<int32_t> last_token_;
  std::vector<std::string> echo_;
  size_t n_finished_ = 0;
  bool done_ = false;  // response complete, or abandoned

  std::mutex inbox_mu_;
  std::vector<std::pair<size_t, GenerationEvent>> inbox_;
  bool drain_posted_ = false;
};

}  // namespace kiln::server
