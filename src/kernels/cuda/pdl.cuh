// Programmatic dependent launch (PDL, sm_90): lets a kernel start before the one ahead of it in the
// stream has finished, so a decode step's ~300 back-to-back kernels stop paying a launch gap each
// and a GEMV can start streaming its weights (which no earlier kernel writes) while the small
// kernel before it (rmsnorm, silu_mul) still runs.
//
// The contract, which every kernel launched through launch_pdl keeps:
//   * before pdl_wait() it touches only memory no kernel of the step writes (weights, K/V cache
//     entries of earlier steps), and writes nothing; pdl_wait() returns once the previous kernel has
//     completed and its writes are visible;
//   * it calls pdl_launch_dependents() only after its own pdl_wait(), so the kernel after it is
//     launched early only once this one is past its wait: at most two kernels ever overlap, and
//     only in the next one's pre-wait part.
// A kernel launched normally (without the attribute) after a PDL kernel waits for it as usual, so
// kernels can adopt PDL one at a time. Before sm_90 both calls compile to nothing and launch_pdl
// launches normally. KILN_PDL=0 turns the attribute off (for comparison).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace kiln::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Fire-and-forget fetch of the 16 bytes at p into L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Whether launches carry the PDL attribute: on compute capability >= 9 unless KILN_PDL=0.
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("KILN_PDL");
    if (env && std::strcmp(env, "0") == 0) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = pdl_enabled() ? 1 : 0;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace kiln::cuda
