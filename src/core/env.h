// The KILN_* variables of the same-binary comparisons in docs/performance/. A switch turns one
// optimization off: it is on unless its variable is set to "0". A setting (env_int) picks a value
// for an experiment. Callers read them once (a function-local static), so a step never calls getenv.
#pragma once

#include <climits>
#include <cstdlib>
#include <cstring>

namespace kiln {

inline bool env_switch_on(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::strcmp(e, "0") == 0);
}

// The integer in `name` when it is set to one, else `fallback` (unset, empty or not a number).
inline int env_int(const char* name, int fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return *end == '\0' && v >= INT_MIN && v <= INT_MAX ? int(v) : fallback;
}

}  // namespace kiln
