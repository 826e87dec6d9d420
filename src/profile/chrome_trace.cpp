#include "profile/chrome_trace.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace kiln::profile {

std::string chrome_trace_json(const std::vector<TraceEvent>& events, const std::string& title) {
  std::vector<TraceEvent> sorted = events;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
  nlohmann::json out = nlohmann::json::array();
  out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", title}}}});
  // Track 0 unless the kernel starts before the previous one on track 0 has ended (an overlap).
  double track0_end = -1;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TraceEvent& e = sorted[i];
    const int tid = e.start_us < track0_end ? 1 : 0;
    if (tid == 0) track0_end = e.start_us + e.dur_us;
    out.push_back({{"name", e.name},
                   {"cat", "kernel"},
                   {"ph", "X"},
                   {"pid", 0},
                   {"tid", tid},
                   {"ts", e.start_us},
                   {"dur", e.dur_us},
                   {"args", {{"kernel", e.detail}, {"index", i}}}});
  }
  return nlohmann::json({{"traceEvents", out}, {"displayTimeUnit", "ns"}}).dump(1) + "\n";
}

}  // namespace kiln::profile
