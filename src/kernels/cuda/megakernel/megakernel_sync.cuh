// The synchronization of the decode megakernel (decode_megakernel.cu), in two layers:
//
//  * inside a block, a ring of shared-memory slots between the producer warps and the consumer
//    warps: a producer copies weight chunks into a free slot with cp.async (16 bytes a lane, L2
//    only) and each of its lanes arms the slot's `full` mbarrier with cp.async.mbarrier.arrive.noinc,
//    which fires once that lane's copies have landed (or, KILN_MEGAKERNEL_TMA=1, one producer arms
//    `full` with the slot's bytes and has the TMA unit copy the rows); the consumers wait on `full`,
//    read the slot, and each consumer warp arrives once on the slot's `empty` mbarrier, which the
//    producer waits on before it refills the slot. Weights depend on no activation, so the
//    producers run ahead of the consumers through every phase of every layer, bounded only by the ring.
//  * across blocks, one counter per phase of the step (zeroed before each launch): a block
//    arrives when its share of the phase is written (release), and a block that needs the
//    phase's results waits until all gridDim.x blocks have arrived (acquire). Data crossing blocks
//    is read with ld.global.cg (L2; the SM's L1 is not coherent with other SMs' stores).
//
// A wait that has not finished after kWatchdogNs traps (a kernel error the host reports), so a
// bug shows as an error instead of a hung GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda::mk {

constexpr uint64_t kWatchdogNs = 4000000000ull;  // 4 s: a decode step takes milliseconds

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- mbarriers (shared memory, CTA scope) ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
#else
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
#endif
  return ok != 0;
}

// Waits until the phase of parity `parity` of `bar` has completed.
// (The watchdog reads the timer every 64 polls: %globaltimer reads are not free.)
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  if (mbar_test(bar, parity)) return;
  const uint64_t t0 = global_ns();
  for (uint32_t n = 1; !mbar_test(bar, parity); ++n)
    if (n % 64 == 0 && global_ns() - t0 > kWatchdogNs) __trap();
}

// mbar_wait by lane 0 only, the warp then released by __syncwarp (whose memory ordering carries lane
// 0's acquire to the others): one mbarrier operation a wait instead of 32 in the shared-memory pipe
// the consumers' operand loads use. (It was a guess at why a slot cost ~0.4 us even with no copies,
// megakernel.md session 19 run 7; it measured no change, run 8: the cost was each warp's serial chain
// per slot, run 9.)
__device__ __forceinline__ void mbar_wait_warp(uint64_t* bar, uint32_t parity) {
  if (threadIdx.x % 32 == 0) mbar_wait(bar, parity);
  __syncwarp();
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// KILN_MEGAKERNEL_TMA=1's copies: bulk copies by the TMA unit (sm_90), each completing its bytes on
// the slot's mbarrier, which the producer armed with the slot's byte count (arrive.expect_tx).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
#else
  __trap();  // the megakernel runs on sm_90 only (megakernel_unsupported)
#endif
}

__device__ __forceinline__ void bulk_copy(void* dst_smem, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst_smem)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
#else
  __trap();
#endif
}

// 16 bytes global -> shared, bypassing L1, the L2 asked to fetch the whole 256-byte span.
__device__ __forceinline__ void cp_async16(void* dst_smem, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_addr(dst_smem)), "l"(src)
               : "memory");
}

// One arrival on `bar` once every cp.async this thread issued before it has landed (the barrier's
// count must include this arrival: .noinc).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// A named barrier over the consumer warps only (barrier 0 is __syncthreads, which the producer
// warp would have to join).
__device__ __forceinline__ void consumers_sync(int threads) {
  asm volatile("bar.sync 1, %0;\n" ::"r"(threads) : "memory");
}

// ---- data other blocks wrote during this launch: read at L2 ----

// (__ldcg, not asm volatile: the compiler may batch these loads; the barriers that order them
// after a phase's wait are asm volatile with a memory clobber.)
__device__ __forceinline__ uint4 ld_cg16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint2 ld_cg8(const void* p) { return __ldcg(reinterpret_cast<const uint2*>(p)); }

// Fire-and-forget fetch of the line holding p into L1, for read-only data (pdl.cuh's prefetch_l2
// fetches into L2).
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p)); }

// ---- phase counters in global memory ----

// Called by one thread after the block's writes of the phase are complete (the caller ran a
// barrier over the threads that wrote them first).
__device__ __forceinline__ void phase_arrive(uint32_t* counter) {
  __threadfence();
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(counter) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Called by one thread: returns once `counter` has reached `target` (the caller then runs a barrier
// over the threads that read the phase's results).
__device__ __forceinline__ void phase_wait(const uint32_t* counter, uint32_t target) {
  if (ld_acquire(counter) >= target) return;
  const uint64_t t0 = global_ns();
  for (uint32_t n = 1; ld_acquire(counter) < target; ++n)
    if (n % 64 == 0 && global_ns() - t0 > kWatchdogNs) __trap();
}

}  // namespace kiln::cuda::mk
