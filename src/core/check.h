// The error idiom: KILN_CHECK(cond, errc, "fmt", args...) throws kiln::Error with a formatted
// message when cond is false. Messages say what was wrong and, where it helps, what to do.
#pragma once

#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln {
[[noreturn]] void throw_error(Errc code, std::string message);
}  // namespace kiln

#define KILN_FAIL(errc, ...) ::kiln::throw_error(::kiln::Errc::errc, ::fmt::format(__VA_ARGS__))

#define KILN_CHECK(cond, errc, ...)  \
  do {                               \
    if (!(cond)) [[unlikely]] {      \
      KILN_FAIL(errc, __VA_ARGS__);  \
    }                                \
  } while (0)
