// The KILN_* variables of the same-binary comparisons in docs/performance/. A switch turns one
// optimization off: it is on unless its variable is set to "0". A setting (env_int) picks a value
// for an experiment. Callers read them once (a function-local static), so a step never calls getenv.
#pragma once

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

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

// env_int for a setting with a few meaningful values: one set to anything else (a typo, an
// unsupported size) is reported on stderr and `fallback` used, so an experiment does not quietly
// measure the default under another name. Callers read it once, as env_int.
inline int env_int_of(const char* name, int fallback, std::initializer_list<int> allowed) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  const int v = env_int(name, INT_MIN);  // INT_MIN: not a number (no setting allows it)
  for (int a : allowed)
    if (v == a) return v;
  std::fprintf(stderr, "kiln: %s=%s is not one of its values; using %d\n", name, e, fallback);
  return fallback;
}

}  // namespace kiln
