// The current device's attributes, for the host code that sizes and configures launches. The SM
// count is queried once and shared (the decode GEMVs, the split argmax, the GEMMs' split-K plan,
// the megakernel); other attributes are queried by the callers that cache them themselves.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace kiln::cuda {

// Attribute `a` of the current device, queried now.
inline int device_attribute(cudaDeviceAttr a) {
  int dev = 0, v = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, a, dev));
  return v;
}

inline int device_sm_count() {
  static const int n = device_attribute(cudaDevAttrMultiProcessorCount);
  return n;
}

}  // namespace kiln::cuda
