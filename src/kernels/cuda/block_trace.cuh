// The device side of block_trace.h: thread 0 of a traced block stamps its record. Stateless: each
// stamp finds the record from the kernel's `slot` parameter again, so a traced kernel holds no
// register for it between stamps (the decode GEMVs run at their register limit).
#pragma once

#include <cstdint>

#include "kernels/cuda/block_trace.h"

namespace kiln::cuda {

template <int kBlocks, int kWords>
struct BlockStamps {
  // This block's record in the launch's area `slot`, or nullptr (not thread 0, past the traced
  // blocks, or tracing off: slot is nullptr).
  static __device__ __forceinline__ uint64_t* record(uint64_t* slot) {
    return slot && threadIdx.x == 0 && int(blockIdx.x) < kBlocks ? slot + int64_t(blockIdx.x) * kWords : nullptr;
  }
  static __device__ __forceinline__ void cycles(uint64_t* slot, int word) {
    if (uint64_t* r = record(slot)) r[word] = clock64();
  }
  static __device__ __forceinline__ void value(uint64_t* slot, int word, uint64_t v) {
    if (uint64_t* r = record(slot)) r[word] = v;
  }
  static __device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  // At entry: the clocks, the SM, and the kernel's own words cleared (a graph replay's slot holds
  // the last replay's, and a kernel may skip some of its points).
  static __device__ __forceinline__ void enter(uint64_t* slot) {
    uint64_t* r = record(slot);
    if (!r) return;
    r[kTraceEntryNs] = globaltimer();
    r[kTraceEntry] = clock64();
    uint32_t id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    r[kTraceSm] = id;
    for (int w = kTraceFirstOwn; w < kWords; ++w) r[w] = 0;
  }
  static __device__ __forceinline__ void exit(uint64_t* slot) {
    uint64_t* r = record(slot);
    if (!r) return;
    r[kTraceExitNs] = globaltimer();
    r[kTraceExit] = clock64();
  }
};

}  // namespace kiln::cuda
