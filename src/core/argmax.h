// The index of the largest value: ties go to the lowest index (as llama.cpp, PyTorch and the GPU
// argmax kernel), NaN never wins; -1 when every value is NaN (or there are none). The one
// definition the sampler, the backends' host paths and the tests share.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

namespace kiln {

inline int32_t argmax(std::span<const float> values) {
  int32_t best = -1;
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isnan(values[i]) && (best < 0 || values[i] > values[size_t(best)])) best = int32_t(i);
  return best;
}

}  // namespace kiln
