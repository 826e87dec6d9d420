// The KILN_* switches that turn one optimization off for a same-binary comparison (their entries in
// docs/performance/): a switch is on unless its variable is set to "0". Callers read it once
// (a function-local static), so a step never calls getenv.
#pragma once

#include <cstdlib>
#include <cstring>

namespace kiln {

inline bool env_switch_on(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::strcmp(e, "0") == 0);
}

}  // namespace kiln
