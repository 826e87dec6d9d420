// argmax: a block reduction of (value, index). Top-k/top-p: the k-th largest logit T is found by a
// radix select over the order-preserving integer image of the floats (4 passes of 8 bits, a
// 256-bin shared histogram each; always exactly 4 passes, whatever the input). The keys > T are
// gathered, then the keys == T in id order until k candidates (ties go to the lower id), the
// candidates are bitonic-sorted (value descending, id ascending), and one thread runs the softmax,
// the top-p cut and the draw over at most 1024 candidates. NaN logits are never candidates;
// -inf logits are (weight 0 unless every candidate is -inf, then they are drawn uniformly).
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/epilogue.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;  // below every number (-inf maps to 0x007fffff)
  uint32_t b = f == 0.0f ? 0u : __float_as_uint(f);  // -0 ties with +0, as in a float compare
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // larger float -> larger key
}

// (value, index) "better": larger value, then smaller index. NaN logits lose to everything.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (isnan(v)) return false;
  if (isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* __restrict__ logits, int64_t vocab,
                                                          int32_t* __restrict__ out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  float bv = NAN;
  int bi = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    if (better(row[i], int(i), bv, bi)) bv = row[i], bi = int(i);
  for (int off = 16; off > 0; off >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = bi;
  __syncthreads();
  if (threadIdx.x < 32) {
    bv = sv[threadIdx.x], bi = si[threadIdx.x];
    for (int off = 16; off > 0; off >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (threadIdx.x == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int64_t vocab,
                                                          SampleParams p, int32_t* __restrict__ out) {
  __shared__ float cv[kSampleMaxK];
  __shared__ int ci[kSampleMaxK];
  __shared__ int hist[256];
  __shared__ int warp_sums[kThreads / 32];
  __shared__ uint32_t sel_digit;
  __shared__ int sel_remaining, n_gt;
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  const int k = int(imin64(vocab, (p.top_k <= 0 || p.top_k > kSampleMaxK) ? kSampleMaxK : p.top_k));
  if (k <= 0) {  // empty row (vocab 0): uniform over the block, no barrier reached
    if (threadIdx.x == 0) out[blockIdx.x] = 0;
    return;
  }

  // Radix select: T = the k-th largest key (NaN keys are 0, so they count but rank last).
  // Invariant: `remaining` (>= 1) of the keys matching `prefix` on the bits decided so far rank
  // at or below T; the pass picks the digit where the count from the top reaches it.
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      uint32_t key = order_key(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0;
      uint32_t dgt = 0;
      int rem = remaining;
      for (int d = 255; d >= 0; --d) {  // bounded; always finds a digit since count >= remaining
        if (cum + hist[d] >= remaining) {
          dgt = uint32_t(d);
          rem = remaining - cum;
          break;
        }
        cum += hist[d];
      }
      sel_digit = dgt;
      sel_remaining = rem;
    }
    __syncthreads();
    prefix |= sel_digit << shift;
    mask |= 255u << shift;
    remaining = sel_remaining;
    __syncthreads();  // sel_* and hist are rewritten by the next pass
  }
  const uint32_t T = prefix;  // `remaining` keys equal to T are taken (the lowest ids)

  if (threadIdx.x == 0) n_gt = 0;
  cv[threadIdx.x] = -INFINITY;
  ci[threadIdx.x] = 0x7fffffff;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {  // fewer than k keys are > T
    float v = row[i];
    if (order_key(v) > T) {
      int slot = atomicAdd(&n_gt, 1);
      if (slot < kSampleMaxK) cv[slot] = v, ci[slot] = int(i);
    }
  }
  __syncthreads();
  const int gt = min(n_gt, kSampleMaxK);
  int n_cand = gt;
  if (T != 0u) {  // ties at T, in id order (a block-wide prefix count per chunk of kThreads ids)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int taken = 0;
    for (int64_t base = 0; base < vocab && taken < remaining; base += kThreads) {  // uniform bounds
      int64_t i = base + threadIdx.x;
      bool tie = i < vocab && order_key(row[i]) == T;
      unsigned bal = __ballot_sync(0xffffffffu, tie);
      if (lane == 0) warp_sums[warp] = __popc(bal);
      __syncthreads();
      int before = 0, total = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        int c = warp_sums[w];
        before += w < warp ? c : 0;
        total += c;
      }
      int rank = taken + before + __popc(bal & ((1u << lane) - 1u));
      if (tie && rank < remaining && gt + rank < kSampleMaxK) cv[gt + rank] = row[i], ci[gt + rank] = int(i);
      taken += total;
      __syncthreads();  // warp_sums is rewritten by the next chunk
    }
    n_cand = min(kSampleMaxK, gt + min(taken, remaining));
  }
  __syncthreads();
  // Bitonic sort of 1024 (value desc, id asc); one element a thread.
  for (int size = 2; size <= kSampleMaxK; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      int i = threadIdx.x, j = i ^ stride;
      if (j > i) {
        bool desc = (i & size) == 0;
        bool j_better = better(cv[j], ci[j], cv[i], ci[i]);
        if (j_better == desc) {
          float tv = cv[i];
          int ti = ci[i];
          cv[i] = cv[j], ci[i] = ci[j];
          cv[j] = tv, ci[j] = ti;
        }
      }
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) {
    const int n = min(k, n_cand);
    if (n == 0) {  // every logit NaN
      out[blockIdx.x] = 0;
      return;
    }
    const float inv_t = 1.0f / fmaxf(p.temperature, 1e-6f), top = cv[0];
    float total = 0.0f;
    // Weight of candidate i; equal to the top counts 1 (so an all -inf or a +inf top is not NaN).
    auto weight = [&](int i) { return cv[i] == top ? 1.0f : expf((cv[i] - top) * inv_t); };
    for (int i = 0; i < n; ++i) total += weight(i);
    float kept = 0.0f;
    int n_keep = n;
    for (int i = 0; i < n; ++i) {
      kept += weight(i);
      if (kept >= p.top_p * total) {
        n_keep = i + 1;
        break;
      }
    }
    float target = sample_uniform(p.seed, blockIdx.x) * kept, acc = 0.0f;
    int pick = ci[n_keep - 1];
    for (int i = 0; i < n_keep; ++i) {
      acc += weight(i);
      if (acc > target) {
        pick = ci[i];
        break;
      }
    }
    out[blockIdx.x] = pick;
  }
}

}  // namespace

void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, vocab, out);
  KILN_CUDA_CHECK_LAUNCH();
}

void sample_top_k_top_p(const float* logits, int64_t rows, int64_t vocab, SampleParams params, int32_t* out,
                        cudaStream_t stream) {
  if (rows == 0) return;
  if (params.temperature <= 0.0f) return argmax(logits, rows, vocab, out, stream);
  sample_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, vocab, params, out);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
