// Programmatic dependent launch (PDL, sm_90): lets a kernel start before the one ahead of it in the
// stream has finished, so a decode step's ~300 back-to-back kernels stop paying a launch gap each
// and a GEMV can start streaming its weights (which no earlier kernel writes) while the kernel
// before it still runs: the decode GEMVs (bf16 gemv_mma.cuh, int8/int4 qgemv_v3.cu) issue their
// first weight loads, then wait (session 6: tg128 +2.0%, int8 +3.8%, int4 +4.9%; same binary,
// KILN_GEMV_PDL=0 for the comparison).
//
// The contract, which every kernel launched through launch_pdl keeps:
//   * before pdl_wait() it touches only memory no kernel of the step writes (weights, K/V cache
//     entries of earlier steps), and writes nothing -- an L2 prefetch (prefetch_l2), which returns
//     no data, may name any memory; pdl_wait() returns once the previous kernel has
//     completed and its writes are visible;
//   * it calls pdl_launch_dependents() only after its own pdl_wait(), so the kernel after it is
//     launched early only once this one is past its wait: at most two kernels ever overlap, and
//     only in the next one's pre-wait part;
//   * every block that exits calls pdl_wait() first (or the grid has a block that does), so a
//     kernel's completion implies its predecessor's: a dependent's pdl_wait() waits only for the
//     kernel right before it.
// (Releasing the dependent GEMV before the wait in rmsnorm and the attention combine, so its
// blocks could fill the SMs the kernel before frees, cost 13% of tg128 in session 6: the waiting
// GEMV blocks hold the SMs the 1024-thread rmsnorm block needs. Not kept.)
// A kernel launched normally (without the attribute) after a PDL kernel waits for it as usual, so
// kernels can adopt PDL one at a time. Before sm_90 both calls compile to nothing and launch_pdl
// launches normally. KILN_PDL=0 turns the attribute off (for comparison).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"

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

// A 16-byte load of data the kernel before this one wrote (x of a GEMV), for use after pdl_wait().
// Not ld.global.nc (__ldg): the non-coherent path assumes the data is read-only for the kernel's
// whole lifetime, and under PDL the writer was still running when this kernel started.
__device__ __forceinline__ uint4 ld_after_wait(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// ld_after_wait where `pred` holds, else zeros: the condition is tested inside the asm (a predicated
// load, no branch), so lanes with nothing to read issue no load. Written as a plain `pred ? load :
// 0` the volatile asm cannot be if-converted and the compiler branches around every load.
__device__ __forceinline__ uint4 ld_after_wait_if(const void* p, bool pred) {
  uint4 v;
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
      "mov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "@q ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(int(pred)));
  return v;
}

// Fire-and-forget fetch of the 16 bytes at p into L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Whether launches carry the PDL attribute: on compute capability >= 9 unless KILN_PDL=0.
inline bool pdl_enabled() {
  static const bool on = [] {
    if (!env_switch_on("KILN_PDL")) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

// Whether the decode GEMVs (bf16 and int8/int4) launch with PDL: on with pdl_enabled() unless
// KILN_GEMV_PDL=0 (the same-binary comparison of docs/PERFORMANCE.md, session 6).
inline bool gemv_pdl_enabled() {
  static const bool on = env_switch_on("KILN_GEMV_PDL");
  return on && pdl_enabled();
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization allowed
// when `pdl` is true and pdl_enabled().
template <typename... Params, typename... Args>
void launch_maybe_pdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = pdl && pdl_enabled() ? 1 : 0;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  launch_maybe_pdl(true, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace kiln::cuda
