// Text-level stop strings for streamed output. Text goes in as it is detokenized; what comes out
// is safe to send: text that could still be the start of a stop string is held back until the
// next piece decides it. When a stop string appears, the output ends just before it (or just
// after it with include_stop) and matched() turns true.
//
// Cut points are always character boundaries: the input is valid UTF-8 and a match or a held-back
// suffix begins where a (valid UTF-8) stop string begins.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops, bool include_stop = false);

  // Appends `text`; returns what may now be sent. After a match, returns "" forever.
  std::string push(std::string_view text);
  // The end of the stream: whatever is still held back (no stop string can complete any more).
  std::string finish();

  bool matched() const { return matched_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  std::string held_;
  bool matched_ = false;
  std::string matched_stop_;
};

}  // namespace kiln::server
