// Warming the L2 with the next GEMV's weights while a batch-1 step's HBM would idle (session 41,
// an experiment, off unless asked: docs/performance/decode-l2-ahead.md).
//
// Between the qkv GEMV's end and the gate/up GEMV's start the int4 step streams only the o
// projection (8.4 MB of ~17 µs a layer on the H200): the attention, the o GEMV's ramp and tail and
// the RMSNorm leave HBM mostly idle, and the gate/up GEMV after them streams 61 MB from HBM alone.
// An armed launch's blocks ask a tail of that next matrix (its last rows and their scales) into L2
// before their PDL wait, one bulk prefetch a block, so the gate/up GEMV reads those rows from L2.
// The PDL contract allows it (pdl.cuh: an L2 prefetch may name any memory before the wait).
#pragma once

#include <cstdint>

#include "kernels/cuda/quant/qmatmul.h"

namespace kiln::cuda {

// Byte ranges the armed launch prefetches into L2, split evenly over its blocks.
struct L2Ahead {
  const char* w = nullptr;  // the next matrix's last rows (packed bytes)
  int64_t w_bytes = 0;
  const char* s = nullptr;  // those rows' scales
  int64_t s_bytes = 0;
  int delay_ns = 0;  // each block's threads sleep this long first (after the block's own requests)
  bool per_line = false;  // prefetch.global.L2 a line instead of one cp.async.bulk.prefetch.L2 a block
};

// The last rows of `w` adding up to about `bytes` of packed data (whole rows), and their scales;
// empty for bf16 / fp8 weights or bytes <= 0.
L2Ahead l2_ahead_tail(const QWeight& w, int64_t bytes, int delay_ns);

// l2_ahead_tail with the KB the variable `kb_var` sets (0 or unset: empty), KILN_L2_AHEAD_DELAY_NS and
// KILN_L2_AHEAD_LINES=1 (per_line).
L2Ahead l2_ahead_from_env(const QWeight& w, const char* kb_var);

// The next int8 / int4 decode GEMV launch (qgemv v3) carries `ahead`; that launch disarms it.
void qgemv_arm_l2_ahead(const L2Ahead& ahead);
void qgemv_disarm_l2_ahead();
L2Ahead qgemv_take_l2_ahead();  // the armed ranges (empty if none), disarmed

#ifdef __CUDACC__
// One block's share of a range, 128-byte aligned pieces (the last one shorter): one bulk prefetch by
// thread 0, or (per_line) one prefetch.global.L2 a 128-byte line spread over the block's threads.
__device__ __forceinline__ void l2_ahead_piece(const char* p, int64_t bytes, bool per_line) {
  if (bytes <= 0) return;
  const int64_t per = ((bytes + gridDim.x - 1) / gridDim.x + 127) & ~int64_t(127);
  const int64_t lo = int64_t(blockIdx.x) * per;
  if (lo >= bytes) return;
  const int64_t n = bytes - lo < per ? bytes - lo : per;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (!per_line) {
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + lo), "r"(uint32_t(n)) : "memory");
    return;
  }
#endif
  for (int64_t o = int64_t(threadIdx.x) * 128; o < n; o += int64_t(blockDim.x) * 128)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + lo + o));
}

// Called by every thread of a block before its PDL wait.
__device__ __forceinline__ void l2_ahead_issue(const L2Ahead& a) {
  if (a.w_bytes <= 0) return;
  if (a.delay_ns > 0) __nanosleep(unsigned(a.delay_ns));
  l2_ahead_piece(a.w, a.w_bytes, a.per_line);
  l2_ahead_piece(a.s, a.s_bytes, a.per_line);
}
#endif

}  // namespace kiln::cuda
