// The assertion every bad-input test makes: running f throws kiln::Error with `code`, and its
// message contains `needle` (so each rejection is shown to be the intended one, not any error).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kiln/error.h"

namespace kiln::test {

template <typename F>
void expect_error(F&& f, const std::string& needle, Errc code) {
  try {
    f();
    ADD_FAILURE() << "succeeded, but should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

}  // namespace kiln::test
