// The SM count of the current device, queried once: the kernels that size their grids from it
// (the decode GEMVs, the split argmax) share this one query.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace kiln::cuda {

inline int device_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

}  // namespace kiln::cuda
