// core/env.h: the experiment settings' parsing (switches, integers, and settings with a few values).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/env.h"

namespace kiln {
namespace {

// Sets one variable for a test's duration and restores its absence after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

constexpr const char* kVar = "KILN_ENV_TEST_SETTING";

TEST(Env, SwitchIsOnUnlessZero) {
  unsetenv(kVar);
  EXPECT_TRUE(env_switch_on(kVar));
  {
    ScopedEnv e(kVar, "0");
    EXPECT_FALSE(env_switch_on(kVar));
  }
  ScopedEnv e(kVar, "1");
  EXPECT_TRUE(env_switch_on(kVar));
}

TEST(Env, IntFallsBackWhenUnsetEmptyOrNotANumber) {
  unsetenv(kVar);
  EXPECT_EQ(env_int(kVar, 7), 7);
  for (const char* bad : {"", "12x", "x", "99999999999"}) {
    ScopedEnv e(kVar, bad);
    EXPECT_EQ(env_int(kVar, 7), 7) << bad;
  }
  ScopedEnv e(kVar, "-3");
  EXPECT_EQ(env_int(kVar, 7), -3);
}

TEST(Env, IntOfTakesOnlyItsValuesAndReportsTheRest) {
  unsetenv(kVar);
  EXPECT_EQ(env_int_of(kVar, 128, {128, 256, 64, 0}), 128);
  for (const char* good : {"256", "64", "0"}) {
    ScopedEnv e(kVar, good);
    EXPECT_EQ(env_int_of(kVar, 128, {128, 256, 64, 0}), std::atoi(good));
  }
  for (const char* bad : {"100", "abc", "2566"}) {
    ScopedEnv e(kVar, bad);
    testing::internal::CaptureStderr();
    EXPECT_EQ(env_int_of(kVar, 128, {128, 256, 64, 0}), 128) << bad;
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find(kVar), std::string::npos) << err;
    EXPECT_NE(err.find(bad), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace kiln
