// argmax: a block reduction of (value, index). sample_rows (one 1024-thread block a row): the
// penalties in place, the top logit, then either the Gumbel-max draw over the whole row (no top-k,
// no top-p: one pass) or the top-k candidates -- the k-th largest logit T by a radix select over
// the order-preserving integer image of the floats (4 passes of 8 bits, a 256-bin shared histogram
// each), the keys > T, then the keys == T in id order (ties go to the lower id), a bitonic sort
// (value descending, id ascending) -- and one thread's top-p / min-p cut and draw over at most
// 1024 of them. NaN logits are never chosen.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/argmax_order.cuh"
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

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* __restrict__ logits, int64_t vocab,
                                                          int32_t* __restrict__ out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  float bv = NAN;
  int bi = kArgmaxNoIndex;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    if (argmax_better(row[i], int(i), bv, bi)) bv = row[i], bi = int(i);
  for (int off = 16; off > 0; off >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (argmax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = bi;
  __syncthreads();
  if (threadIdx.x < 32) {
    bv = sv[threadIdx.x], bi = si[threadIdx.x];
    for (int off = 16; off > 0; off >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (argmax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (threadIdx.x == 0) out[blockIdx.x] = bi == kArgmaxNoIndex ? 0 : bi;
  }
}

// Block-wide "better" reduction of each thread's (value, id); every thread gets the winner.
template <int kBlock = kThreads>
__device__ __forceinline__ void block_best(float& bv, int& bi, float* sv, int* si) {
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (argmax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = bi;
  __syncthreads();
  bv = sv[0], bi = si[0];
  for (int w = 1; w < kBlock / 32; ++w)
    if (argmax_better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
  __syncthreads();  // sv / si may be reused
}

// Split argmax (rows <= kArgmaxSplitRows): block (split, row) takes a contiguous 1 / splits of the
// row, 8 loads in flight a thread, and leaves its best (value, id); the last block of the row to
// finish (a ticket counter, reset by that block) reduces the partials in split order, so ties still
// go to the lowest id.
constexpr int kSplitThreads = 256, kSplitUnroll = 8;

__global__ void __launch_bounds__(kSplitThreads) argmax_split_kernel(const float* __restrict__ logits, int64_t vocab,
                                                                     ArgmaxWorkspace ws, int32_t* __restrict__ out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ bool last;
  const int splits = int(gridDim.x), split = int(blockIdx.x), row = int(blockIdx.y);
  const float* r = logits + int64_t(row) * vocab;
  const int64_t chunk = (vocab + splits - 1) / splits, begin = split * chunk, end = min(vocab, begin + chunk);
  float bv = NAN;
  int bi = kArgmaxNoIndex;
  for (int64_t i0 = begin + threadIdx.x; i0 < end; i0 += kSplitThreads * kSplitUnroll) {
    float v[kSplitUnroll];
#pragma unroll
    for (int u = 0; u < kSplitUnroll; ++u) {
      const int64_t i = i0 + u * kSplitThreads;
      v[u] = i < end ? r[i] : NAN;
    }
#pragma unroll
    for (int u = 0; u < kSplitUnroll; ++u)
      if (argmax_better(v[u], int(i0 + u * kSplitThreads), bv, bi)) bv = v[u], bi = int(i0 + u * kSplitThreads);
  }
  block_best<kSplitThreads>(bv, bi, sv, si);
  const int slot = row * kArgmaxMaxSplits + split;
  if (threadIdx.x == 0) {
    ws.values[slot] = bv;
    ws.ids[slot] = bi;
    __threadfence();  // the partial is visible before the ticket says so
    last = atomicAdd(ws.tickets + row, 1u) == unsigned(splits - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  bv = NAN;
  bi = kArgmaxNoIndex;
  if (int(threadIdx.x) < splits) {
    bv = __ldcg(ws.values + row * kArgmaxMaxSplits + threadIdx.x);
    bi = __ldcg(ws.ids + row * kArgmaxMaxSplits + threadIdx.x);
  }
  block_best<kSplitThreads>(bv, bi, sv, si);
  if (threadIdx.x == 0) {
    out[row] = bi == kArgmaxNoIndex ? 0 : bi;
    ws.tickets[row] = 0;  // ready for the next call (the next kernel in the stream sees it)
  }
}

// Sum over the block, in a fixed order (the same bits every run).
__device__ __forceinline__ float block_sum(float v, float* sv) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) v += sv[w];
  __syncthreads();
  return v;
}

// A candidate's weight relative to the top logit: 1 for a value equal to the top (so an all -inf
// row or a +inf top is not NaN), else exp((v - top) / T).
__device__ __forceinline__ float cand_weight(float v, float top, float inv_t) {
  return v == top ? 1.0f : expf((v - top) * inv_t);
}

// The top k (<= kSampleMaxK) logits of a row into cv / ci, sorted (value desc, id asc); returns how
// many there are (fewer than k only where the row has fewer non-NaN values). Radix select of the
// k-th largest key T over the order-preserving image of the floats (4 passes of 8 bits, a 256-bin
// histogram each), then the keys > T and the keys == T in id order until k, then a bitonic sort.
__device__ int top_candidates(const float* row, int64_t vocab, int k, float* cv, int* ci, int* hist, int* warp_sums) {
  __shared__ uint32_t sel_digit;
  __shared__ int sel_remaining, n_gt;
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t key = order_key(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0, rem = remaining;
      uint32_t dgt = 0;
      for (int d = 255; d >= 0; --d) {  // always finds a digit: the count is >= remaining
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
  ci[threadIdx.x] = kArgmaxNoIndex;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {  // fewer than k keys are > T
    const float v = row[i];
    if (order_key(v) > T) {
      const int slot = atomicAdd(&n_gt, 1);
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
      const int64_t i = base + threadIdx.x;
      const bool tie = i < vocab && order_key(row[i]) == T;
      const unsigned bal = __ballot_sync(0xffffffffu, tie);
      if (lane == 0) warp_sums[warp] = __popc(bal);
      __syncthreads();
      int before = 0, total = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        const int c = warp_sums[w];
        before += w < warp ? c : 0;
        total += c;
      }
      const int rank = taken + before + __popc(bal & ((1u << lane) - 1u));
      if (tie && rank < remaining && gt + rank < kSampleMaxK) cv[gt + rank] = row[i], ci[gt + rank] = int(i);
      taken += total;
      __syncthreads();  // warp_sums is rewritten by the next chunk
    }
    n_cand = min(kSampleMaxK, gt + min(taken, remaining));
  }
  __syncthreads();
  for (int size = 2; size <= kSampleMaxK; size <<= 1) {  // bitonic sort, one element a thread
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      const int i = threadIdx.x, j = i ^ stride;
      if (j > i) {
        const bool desc = (i & size) == 0;
        if (argmax_better(cv[j], ci[j], cv[i], ci[i]) == desc) {
          const float tv = cv[i];
          const int ti = ci[i];
          cv[i] = cv[j], ci[i] = ci[j];
          cv[j] = tv, ci[j] = ti;
        }
      }
      __syncthreads();
    }
  }
  return min(k, n_cand);
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(float* __restrict__ logits, int64_t vocab, const RowSampling* __restrict__ params,
                       const int32_t* __restrict__ pen_ids, const int32_t* __restrict__ pen_counts,
                       int32_t* __restrict__ out) {
  __shared__ float cv[kSampleMaxK];
  __shared__ int ci[kSampleMaxK];
  __shared__ int hist[256];
  __shared__ int warp_sums[kThreads / 32];
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  __shared__ int pick, fallback;
  float* const row = logits + int64_t(blockIdx.x) * vocab;
  const RowSampling p = params[blockIdx.x];

  // Penalties first (sampler.cpp's formulas, in the same float operations).
  for (int j = p.pen_begin + int(threadIdx.x); j < p.pen_end; j += kThreads) {
    const int32_t id = pen_ids[j];
    if (id < 0 || id >= vocab) continue;
    float l = row[id];
    if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * float(pen_counts[j]);
    row[id] = l;
  }
  __syncthreads();

  // The top logit (lowest id on ties), for greedy and as the softmax's reference.
  float bv = NAN;
  int bi = kArgmaxNoIndex;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    if (argmax_better(row[i], int(i), bv, bi)) bv = row[i], bi = int(i);
  block_best(bv, bi, sv, si);
  // Greedy, an empty or all-NaN row, a +inf top (every other weight is 0), or an all -inf row:
  // the argmax is the answer.
  if (p.temperature <= 0.0f || bi == kArgmaxNoIndex || !(bv > -INFINITY) || !(bv < INFINITY)) {
    if (threadIdx.x == 0) out[blockIdx.x] = bi == kArgmaxNoIndex ? 0 : bi;
    return;
  }
  const float top = bv, inv_t = 1.0f / p.temperature;
  const float log_floor = p.min_p > 0.0f ? logf(p.min_p) : -INFINITY;
  const bool k_off = p.top_k <= 0 || int64_t(p.top_k) >= vocab;

  if (threadIdx.x == 0) fallback = k_off && p.top_p >= 1.0f;
  __syncthreads();
  if (!fallback) {
    const int k = int(imin64(vocab, k_off || p.top_k > kSampleMaxK ? kSampleMaxK : p.top_k));
    const int n = top_candidates(row, vocab, k, cv, ci, hist, warp_sums);
    // top-p's mass is counted over what the CPU sampler keeps: the top k, or the whole row.
    float z_full = 0.0f;
    if (k_off) {
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
        if (!isnan(row[i])) z_full += cand_weight(row[i], top, inv_t);
      z_full = block_sum(z_full, sv);
    }
    if (threadIdx.x == 0) {
      float total = z_full;
      if (!k_off)
        for (int i = 0; i < n; ++i) total += cand_weight(cv[i], top, inv_t);
      int n_keep = -1;
      float kept = 0.0f;
      for (int i = 0; i < n; ++i) {
        kept += cand_weight(cv[i], top, inv_t);
        if (kept >= p.top_p * total) {
          n_keep = i + 1;
          break;
        }
      }
      if (n_keep < 0 && !k_off) n_keep = n;  // rounding: the whole top k
      if (n_keep < 0) {
        fallback = 1;  // the nucleus is larger than the candidates: the whole row above min-p
      } else {
        int cut = 1;  // min-p: weights >= min_p (the top's weight is 1)
        while (cut < n_keep && cand_weight(cv[cut], top, inv_t) >= p.min_p) ++cut;
        kept = 0.0f;
        for (int i = 0; i < cut; ++i) kept += cand_weight(cv[i], top, inv_t);
        const float target = sample_uniform(p.seed, p.counter) * kept;
        float acc = 0.0f;
        pick = ci[cut - 1];
        for (int i = 0; i < cut; ++i) {
          acc += cand_weight(cv[i], top, inv_t);
          if (acc > target) {
            pick = ci[i];
            break;
          }
        }
      }
    }
    __syncthreads();
    if (!fallback) {
      if (threadIdx.x == 0) out[blockIdx.x] = pick;
      return;
    }
  }
  // Gumbel-max over the row: argmax of z_i + g_i among z_i = (logit - top) / T >= log(min_p).
  bv = NAN;
  bi = kArgmaxNoIndex;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float z = (row[i] - top) * inv_t;
    if (!(z >= log_floor)) continue;  // NaN logits too
    const float key = z + sample_gumbel(p.seed, p.counter, i);
    if (argmax_better(key, int(i), bv, bi)) bv = key, bi = int(i);
  }
  block_best(bv, bi, sv, si);
  if (threadIdx.x == 0) out[blockIdx.x] = bi == kArgmaxNoIndex ? 0 : bi;
}

// The head GEMM's partials (gemm_argmax, matmul.h): a warp a row over its (value, id) pairs, one
// pair per 256-column tile, id in the float's bits.
constexpr int kPartsWarps = 8;

__global__ void __launch_bounds__(kPartsWarps * 32) argmax_parts_kernel(const float2* __restrict__ parts, int64_t rows,
                                                                        int per_row, int32_t* __restrict__ out) {
  const int64_t row = int64_t(blockIdx.x) * kPartsWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float2* p = parts + row * per_row;
  float bv = NAN;
  int bi = kArgmaxNoIndex;
  for (int i = lane; i < per_row; i += 32) {
    const float2 v = p[i];
    if (argmax_better(v.x, __float_as_int(v.y), bv, bi)) bv = v.x, bi = __float_as_int(v.y);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (argmax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  if (lane == 0) out[row] = bi == kArgmaxNoIndex ? 0 : bi;
}

}  // namespace

void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t stream, ArgmaxWorkspace ws) {
  if (rows == 0) return;
  if (ws.tickets && rows <= kArgmaxSplitRows) {
    // ~2 blocks a SM over all rows, each at least a few thousand logits.
    const int64_t sms = device_sm_count();
    const int64_t splits = std::clamp<int64_t>(std::min(2 * sms / rows, vocab / 2048), 1, kArgmaxMaxSplits);
    argmax_split_kernel<<<dim3(unsigned(splits), unsigned(rows)), kSplitThreads, 0, stream>>>(logits, vocab, ws, out);
  } else {
    argmax_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, vocab, out);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void argmax_parts(const float2* parts, int64_t rows, int per_row, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_parts_kernel<<<unsigned((rows + kPartsWarps - 1) / kPartsWarps), kPartsWarps * 32, 0, stream>>>(parts, rows,
                                                                                                         per_row, out);
  KILN_CUDA_CHECK_LAUNCH();
}

void sample_rows(float* logits, int64_t rows, int64_t vocab, const RowSampling* params, const int32_t* pen_ids,
                 const int32_t* pen_counts, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  sample_rows_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, vocab, params, pen_ids, pen_counts, out);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
