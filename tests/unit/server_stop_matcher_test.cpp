// Text-level stop strings (server/stop_matcher.h): held-back text, matches across pieces,
// earliest match wins, include_stop, multi-byte text.
#include <gtest/gtest.h>

#include "server/stop_matcher.h"

namespace kiln::server {
namespace {

std::string feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  return out + m.finish();
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.finish(), "");
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, HoldsBackAPossibleStart) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("hello E"), "hello ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("X"), "ENX");  // not a stop after all
  EXPECT_EQ(m.push("done EN"), "done ");
  EXPECT_EQ(m.push("D and more"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_stop(), "END");
  EXPECT_EQ(m.push("ignored"), "");
}

TEST(StopMatcher, FinishReleasesHeldText) {
  StopMatcher m({"END"});
  EXPECT_EQ(feed(m, {"abc E", "N"}), "abc EN");
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, EarliestMatchWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(feed(m, {"hel", "lo", " world"}), "hel");
  EXPECT_EQ(m.matched_stop(), "lo w");
}

TEST(StopMatcher, IncludeStop) {
  StopMatcher m({"\n\n"}, true);
  EXPECT_EQ(feed(m, {"a\n", "\nb"}), "a\n\n");
}

TEST(StopMatcher, SelfOverlappingStop) {
  StopMatcher m({"aab"});
  EXPECT_EQ(feed(m, {"a", "a", "a", "b", "c"}), "a");
}

TEST(StopMatcher, MultiByteCutsAtCharacterBoundaries) {
  StopMatcher m({"日本"});
  std::string out = m.push("これは日");
  EXPECT_EQ(out, "これは");
  EXPECT_EQ(m.push("本です"), "");
  EXPECT_TRUE(m.matched());
}

TEST(StopMatcher, EmptyStopsIgnored) {
  StopMatcher m({""});
  EXPECT_EQ(feed(m, {"abc"}), "abc");
}

}  // namespace
}  // namespace kiln::server
