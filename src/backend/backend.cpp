#include "backend/backend.h"

#include "core/check.h"

namespace kiln {

void KvSequence::truncate(int64_t n) {
  KILN_CHECK(n >= 0 && n <= n_past_, invalid_argument, "cannot truncate a sequence of {} tokens to {}", n_past_, n);
  n_past_ = n;
}

}  // namespace kiln
