// Weight loads that ask L2 to pick their lines first when it must evict (createpolicy + .L2::cache_hint),
// for qgemv v3's KILN_QGEMV_EVICT_FIRST (qgemv_v3_grid.h).
//
// Why: a decode step streams every weight once, so a weight line is dead the moment its warp has read
// it, yet with the default policy it competes for L2 with what is read again: the span fetched ahead
// of a warp's requests (qgemv-l2-span.md: in the step's full L2 part of it was evicted and read
// twice), the qkv GEMV's rest prefetched into L2 before its wait, the activations, the KV cache.
// Which lines L2 evicts among those marked evict_first is not documented: the switch exists to measure
// whether it helps (qgemv-l2-span.md, session 43; not yet run on a device).
#pragma once

#include <cstdint>

namespace kiln::cuda::qk {

// A policy that marks every line an access brings into L2 evict_first (fraction 1.0).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// mma_frag.cuh's ld_weight_span with a cache policy: the same load, span (256, 128, 64 or 0) and
// L1 bypass.
__device__ __forceinline__ uint4 ld_weight_span_policy(const void* p, int span, uint64_t policy) {
  uint4 v;
  if (span == 256)
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
  else if (span == 128)
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
  else if (span == 64)
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::64B.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
  else
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
  return v;
}

}  // namespace kiln::cuda::qk
