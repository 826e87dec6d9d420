// argmax: a block reduction of (value, index). Top-k/top-p: the k-th largest logit is found by a
// 32-step binary search over the order-preserving integer image of the floats (each step counts
// the keys >= the candidate over the row), the candidates >= it are gathered into shared memory,
// bitonic-sorted (value descending, id ascending), and one thread runs the softmax, the top-p cut
// and the draw over at most 1024 candidates.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/epilogue.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t b = __float_as_uint(f);
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

__device__ int block_count(int c, int* scratch) {
  for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
  __syncthreads();  // scratch may still be read from the previous call
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = c;
  __syncthreads();
  int total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int64_t vocab,
                                                          SampleParams p, int32_t* __restrict__ out) {
  __shared__ float cv[kSampleMaxK];
  __shared__ int ci[kSampleMaxK];
  __shared__ int scratch[32];
  __shared__ int n_cand;
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  const int k = int(imin64(vocab, (p.top_k <= 0 || p.top_k > kSampleMaxK) ? kSampleMaxK : p.top_k));

  // Largest key T with count(key >= T) >= k: T is the k-th largest key.
  uint32_t lo = 0, hi = 0xffffffffu;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo + 1) / 2;
    int c = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) c += order_key(row[i]) >= mid;
    if (block_count(c, scratch) >= k)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (threadIdx.x == 0) n_cand = 0;
  cv[threadIdx.x] = -INFINITY;
  ci[threadIdx.x] = 0x7fffffff;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    if (order_key(row[i]) >= lo) {
      int slot = atomicAdd(&n_cand, 1);
      if (slot < kSampleMaxK) cv[slot] = row[i], ci[slot] = int(i);
    }
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
    const int n = min(k, min(n_cand, kSampleMaxK));
    if (n == 0) {  // every logit NaN
      out[blockIdx.x] = 0;
      return;
    }
    const float inv_t = 1.0f / fmaxf(p.temperature, 1e-6f), top = cv[0];
    float total = 0.0f;
    for (int i = 0; i < n; ++i) total += expf((cv[i] - top) * inv_t);
    float kept = 0.0f;
    int n_keep = n;
    for (int i = 0; i < n; ++i) {
      kept += expf((cv[i] - top) * inv_t);
      if (kept >= p.top_p * total) {
        n_keep = i + 1;
        break;
      }
    }
    float target = sample_uniform(p.seed, blockIdx.x) * kept, acc = 0.0f;
    int pick = ci[n_keep - 1];
    for (int i = 0; i < n_keep; ++i) {
      acc += expf((cv[i] - top) * inv_t);
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
