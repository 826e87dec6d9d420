// The order every greedy pick on the device uses (sampling.cu's argmax kernels, the head GEMM's
// argmax epilogue and its partials' reduction): a larger value wins, then a smaller index; NaN
// loses to everything. Shared so that a row's id does not depend on which kernel picked it.
#pragma once

#include <cuda_runtime.h>

namespace kiln::cuda {

// No index: the sentinel a row keeps when every value is NaN (the pick is then id 0).
constexpr int kArgmaxNoIndex = 0x7fffffff;

__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
  if (isnan(v)) return false;
  if (isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

}  // namespace kiln::cuda
