// A CUDA driver function reached through the runtime (cudaGetDriverEntryPointByVersion), so kiln
// links no libcuda: the tensor-map encoder of the wgmma kernels (wgmma_ptx.cuh), the green-context
// calls of SmSplit (sm_partition.cpp). Each is asked for at the CUDA version that introduced it: a
// lookup at an older version fails for it.
#pragma once

#include <cuda_runtime.h>

namespace kiln::cuda {

// The entry point `name` at driver API `version` (e.g. 12050), or nullptr where the driver has none.
inline void* driver_entry_point(const char* name, unsigned version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q);
  return e == cudaSuccess && q == cudaDriverEntryPointSuccess ? p : nullptr;
}

}  // namespace kiln::cuda
