// kiln profile --trace's timeline writer: events sorted by start, overlapping kernels on a second
// track, times and names carried through.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "profile/chrome_trace.h"

namespace kiln {
namespace {

TEST(ChromeTrace, SortsByStartAndPutsOverlapsOnASecondTrack) {
  // b starts 2 us before a ends (a PDL overlap); c starts after both.
  const std::vector<profile::TraceEvent> events = {
      {"c", "kc", 20.0, 1.5}, {"a", "ka", 0.0, 10.0}, {"b", "kb", 8.0, 5.0}};
  const nlohmann::json j = nlohmann::json::parse(profile::chrome_trace_json(events, "step"));
  const nlohmann::json& ev = j.at("traceEvents");
  ASSERT_EQ(ev.size(), 4u);  // the process name, then the three kernels
  EXPECT_EQ(ev[0].at("ph"), "M");
  EXPECT_EQ(ev[0].at("args").at("name"), "step");
  const char* names[] = {"a", "b", "c"};
  const double ts[] = {0.0, 8.0, 20.0}, dur[] = {10.0, 5.0, 1.5};
  const int tid[] = {0, 1, 0};
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json& e = ev[size_t(i + 1)];
    EXPECT_EQ(e.at("name"), names[i]);
    EXPECT_EQ(e.at("ph"), "X");
    EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), ts[i]);
    EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), dur[i]);
    EXPECT_EQ(e.at("tid").get<int>(), tid[i]);
    EXPECT_EQ(e.at("args").at("kernel"), std::string("k") + names[i]);
  }
}

TEST(ChromeTrace, EmptyStepIsAValidDocument) {
  const nlohmann::json j = nlohmann::json::parse(profile::chrome_trace_json({}, "nothing"));
  EXPECT_EQ(j.at("traceEvents").size(), 1u);
}

}  // namespace
}  // namespace kiln
