#include "server/stop_matcher.h"

#include <algorithm>

namespace kiln::server {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_) return "";
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  // The earliest match of any stop string (the longest one at equal positions) ends the text.
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    size_t pos = held_.find(s);
    if (pos != std::string::npos && (pos < best || (pos == best && s.size() > best_stop->size()))) {
      best = pos;
      best_stop = &s;
    }
  }
  if (best_stop) {
    matched_ = true;
    matched_stop_ = *best_stop;
    std::string out = held_.substr(0, include_stop_ ? best + best_stop->size() : best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > hold; --len)
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::finish() {
  std::string out = matched_ ? "" : held_;
  held_.clear();
  return out;
}

}  // namespace kiln::server
