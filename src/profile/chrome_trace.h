// A profiled step as a timeline: the Chrome trace-event format ("X" complete events, times in
// microseconds), which ui.perfetto.dev and chrome://tracing open. Kernels that overlap (a kernel
// launched with programmatic dependent launch starts while the one before it still runs) go on a
// second track, so the overlap is visible instead of stacked.
#pragma once

#include <string>
#include <vector>

namespace kiln::profile {

struct TraceEvent {
  std::string name;    // kiln's op ("gate_up+silu.gemv")
  std::string detail;  // the kernel's own (mangled) name
  double start_us = 0;  // from the step's first kernel
  double dur_us = 0;
};

// The JSON document of `events` (any order), with `title` as the process name.
std::string chrome_trace_json(const std::vector<TraceEvent>& events, const std::string& title);

}  // namespace kiln::profile
