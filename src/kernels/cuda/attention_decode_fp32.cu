// The decode attention's fallback for pointers or strides that are not 16-byte aligned (see
// attention_decode.cu): the first CUDA-core flash-decoding kernel, fixed 256-position splits over
// the capacity in fp32, and a combine that loops over the splits.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/epilogue.cuh"

namespace kiln::cuda {
namespace {

constexpr int kHeads = 8;                   // query heads per block (a KV group, or part of one)
constexpr int kThreads = 128;
constexpr int kLanesPerRow = 16;            // 16 x 8 dims = 128 = kAttnMaxHeadDim
constexpr int kSlots = kThreads / kLanesPerRow;  // keys processed at once

__global__ void __launch_bounds__(kThreads)
    decode_split_fp32_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len,
                        DecodeWorkspace ws, int n_heads, int group, int head_groups, int d, int max_splits,
                        float scale) {
  __shared__ float qs[kHeads][kAttnMaxHeadDim];        // scaled queries
  __shared__ float ps[kHeads][kDecodeSplit];           // scores, then exp(score - max)
  __shared__ float red[kSlots][kHeads][kAttnMaxHeadDim];  // P.V partial sums per key slot
  __shared__ float stat_m[kHeads], stat_l[kHeads];

  const int split = blockIdx.x, b = blockIdx.z;
  const int kvh = blockIdx.y / head_groups, hg = blockIdx.y % head_groups;
  const int h0 = kvh * group + hg * kHeads;                     // first query head of this block
  const int nh = min(kHeads, group - hg * kHeads);              // query heads in this block
  const int64_t len = kv_len[b];
  const int64_t p0 = int64_t(split) * kDecodeSplit;
  const int64_t n_pos = imin64(kDecodeSplit, len - p0);  // <= 0: nothing to do
  const int64_t ws_row = (int64_t(b) * n_heads + h0) * max_splits + split;  // (b, h0, split)
  if (n_pos <= 0) {
    if (threadIdx.x < nh) {
      ws.partial_ml[(ws_row + int64_t(threadIdx.x) * max_splits) * 2] = -INFINITY;
      ws.partial_ml[(ws_row + int64_t(threadIdx.x) * max_splits) * 2 + 1] = 0.0f;
    }
    return;
  }

  for (int i = threadIdx.x; i < kHeads * d; i += kThreads) {
    int hh = i / d, c = i % d;
    qs[hh][c] = hh < nh ? __bfloat162float(q[(int64_t(b) * n_heads + h0 + hh) * d + c]) * scale : 0.0f;
  }
  __syncthreads();

  const int slot = threadIdx.x / kLanesPerRow, s = threadIdx.x % kLanesPerRow;
  const bool active = s * 8 < d;  // lanes past the head's last chunk idle (d = 64, 80, 96)

  // 1. scores
  constexpr int kUnroll = 4;
  for (int j0 = 0; j0 < kDecodeSplit; j0 += kSlots * kUnroll) {
    uint4 kr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int j = j0 + u * kSlots + slot;
      kr[u] = (active && j < n_pos) ? *reinterpret_cast<const uint4*>(kv.k + kv.offset(b, p0 + j, kvh) + s * 8)
                                    : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int j = j0 + u * kSlots + slot;
      float kf[8];
      unpack8(kr[u], kf);
#pragma unroll
      for (int hh = 0; hh < kHeads; ++hh) {
        float dot = 0.0f;
        if (active) {
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(qs[hh][s * 8 + e], kf[e], dot);
        }
#pragma unroll
        for (int off = kLanesPerRow / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (s == 0) ps[hh][j] = j < n_pos ? dot : -INFINITY;
      }
    }
  }
  __syncthreads();

  // 2. per-head max and sum (warp w takes heads w, w + 4)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int hh = warp; hh < nh; hh += kThreads / 32) {
    float mx = -INFINITY;
    for (int j = lane; j < kDecodeSplit; j += 32) mx = fmaxf(mx, ps[hh][j]);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (int j = lane; j < kDecodeSplit; j += 32) {
      float p = __expf(ps[hh][j] - mx);  // exp(-inf) = 0 for masked positions
      ps[hh][j] = p;
      sum += p;
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      stat_m[hh] = mx;
      stat_l[hh] = sum;
    }
  }
  __syncthreads();

  // 3. P.V
  float acc[kHeads][8];
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[hh][e] = 0.0f;
  for (int j0 = 0; j0 < n_pos; j0 += kSlots * kUnroll) {
    uint4 vr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int j = j0 + u * kSlots + slot;
      vr[u] = (active && j < n_pos) ? *reinterpret_cast<const uint4*>(kv.v + kv.offset(b, p0 + j, kvh) + s * 8)
                                    : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int j = j0 + u * kSlots + slot;
      if (j >= n_pos) break;
      float vf[8];
      unpack8(vr[u], vf);
#pragma unroll
      for (int hh = 0; hh < kHeads; ++hh) {
        float p = ps[hh][j];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[hh][e] = fmaf(p, vf[e], acc[hh][e]);
      }
    }
  }
  if (active) {
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[slot][hh][s * 8 + e] = acc[hh][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh * d; i += kThreads) {
    int hh = i / d, c = i % d;
    float sum = 0.0f;
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) sum += red[sl][hh][c];
    ws.partial_o[(ws_row + int64_t(hh) * max_splits) * d + c] = sum;
  }
  if (threadIdx.x < nh) {
    ws.partial_ml[(ws_row + int64_t(threadIdx.x) * max_splits) * 2] = stat_m[threadIdx.x];
    ws.partial_ml[(ws_row + int64_t(threadIdx.x) * max_splits) * 2 + 1] = stat_l[threadIdx.x];
  }
}

// Grid (n_heads, batch), one thread per output dim: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
__global__ void decode_combine_fp32_kernel(DecodeWorkspace ws, const int32_t* __restrict__ kv_len, bf16* __restrict__ out,
                                      int n_heads, int d, int max_splits) {
  const int h = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  const int n_splits = int((int64_t(kv_len[b]) + kDecodeSplit - 1) / kDecodeSplit);
  const int64_t row = (int64_t(b) * n_heads + h) * max_splits;
  float mx = -INFINITY;
  for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, ws.partial_ml[(row + s) * 2]);
  float num = 0.0f, den = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    float w = __expf(ws.partial_ml[(row + s) * 2] - mx);
    den += w * ws.partial_ml[(row + s) * 2 + 1];
    if (c < d) num += w * ws.partial_o[(row + s) * d + c];
  }
  if (c < d) out[(int64_t(b) * n_heads + h) * d + c] = __float2bfloat16(num / den);
}

}  // namespace

void attention_decode_fp32(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                           DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                           cudaStream_t stream) {
  const int group = n_heads / n_kv_heads, head_groups = (group + kHeads - 1) / kHeads;
  const int max_splits = int(decode_max_splits(max_kv_len));
  dim3 grid(unsigned(max_splits), unsigned(n_kv_heads * head_groups), unsigned(batch));
  decode_split_fp32_kernel<<<grid, kThreads, 0, stream>>>(q, kv, kv_len, ws, n_heads, group, head_groups, head_dim,
                                                     max_splits, 1.0f / sqrtf(float(head_dim)));
  KILN_CUDA_CHECK_LAUNCH();
  decode_combine_fp32_kernel<<<dim3(unsigned(n_heads), unsigned(batch)), kAttnMaxHeadDim, 0, stream>>>(
      ws, kv_len, out, n_heads, head_dim, max_splits);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
