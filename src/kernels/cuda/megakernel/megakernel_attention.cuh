// The decode megakernel's attention phase: one query token against the contiguous single-sequence
// bf16 cache of one layer, on the consumer warps of the blocks it needs.
//
// Work: (KV head h, split s) per block, S splits per head with S = ceil(L / 128) capped at
// gridDim.x / n_kv_heads, so a short cache keeps to one block per head (no merge across blocks)
// and a long one spreads over the grid (16 blocks a head on 132 SMs). Each of the block's 8 warps
// takes a contiguous range of the split's positions for all GQ query heads of h, 16 at a time:
// lanes j and j + 16 score position base + j over half its key row each (16-byte loads, one
// shuffle joins the halves) against the queries staged in shared memory, the warp keeps an online
// softmax (log2 domain, as the decode kernels), and the values are summed with the probabilities
// broadcast by shuffles (lane l owning dims 4l .. 4l + 3). A group's key and value loads are all
// issued before its first use: one memory round trip per 16 positions, in ~64 registers (a
// 32-position group, one lane per key row, took 128 and spilled at 168). The warps
// merge through shared memory; with S > 1 each block writes its unnormalized partial (max, sum,
// D values per query head) and the block that finishes last for the head (an atomic count) merges
// the S partials. The output is bf16 attn[q head * D + d], as the decode kernels write it.
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/megakernel/megakernel_sync.cuh"

namespace kiln::cuda::mk {

constexpr int kAttnD = 128;        // head_dim the phase is built for
constexpr int kAttnMaxGroup = 8;   // query heads per KV head (the register arrays take 4 or 8)
constexpr int kAttnSplitPositions = 128;

struct AttentionArgs {
  const bf16* q;   // (n_heads * D) rotated queries
  const bf16* k;   // this layer's cache: (capacity, n_kv_heads, D)
  const bf16* v;
  bf16* out;       // (n_heads * D)
  float* ws;       // (n_kv_heads * max splits, group, D + 2) partials
  uint32_t* head_done;  // (n_kv_heads) counts of finished splits, zeroed before the step
  int len;         // positions to attend (the new one included)
  int n_heads, n_kv_heads;
  float scale_log2;  // log2(e) / sqrt(D)
};

// Shared-memory floats the phase needs (it reuses the x staging area).
constexpr int attention_scratch_floats(int group) {
  return group * kAttnD + 2 * 8 * group + 8 * group * kAttnD;
}

__device__ __forceinline__ int attention_splits(int len, int n_kv_heads, int blocks) {
  const int cap = blocks / n_kv_heads > 0 ? blocks / n_kv_heads : 1;
  const int s = (len + kAttnSplitPositions - 1) / kAttnSplitPositions;
  return s < 1 ? 1 : s > cap ? cap : s;
}

// The key and value rows of positions [0, len - 1) this block will read in the attention phase of
// a layer, fetched into L2 while the qkv phase streams (they were written by earlier steps; the
// newest position is being written now and is not fetched). Threads 0 .. 255, one line each turn.
__device__ inline void attention_prefetch(const AttentionArgs& a) {
  const int KVH = a.n_kv_heads;
  const int S = attention_splits(a.len, KVH, int(gridDim.x));
  const int unit = int(blockIdx.x);
  if (unit >= KVH * S) return;
  const int h = unit / S, s = unit % S;
  const int chunk = (a.len + S - 1) / S, p0 = s * chunk, p1 = min(a.len - 1, p0 + chunk);
  const int64_t pos_stride = int64_t(KVH) * kAttnD;
  constexpr int kLines = kAttnD * 2 / 128;  // 128-byte lines of one head's row
  for (int i = int(threadIdx.x); i < (p1 - p0) * kLines * 2; i += 256) {
    const int row = i / (2 * kLines), line = i % (2 * kLines);
    const bf16* base = line < kLines ? a.k : a.v;
    prefetch_l2(base + int64_t(p0 + row) * pos_stride + int64_t(h) * kAttnD + (line % kLines) * 64);
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// exp2(a - m) with exp2(-inf - -inf) taken as 0 (an empty warp or split).
__device__ __forceinline__ float exp2_from(float a, float m) { return a == -INFINITY ? 0.0f : exp2f(a - m); }

// Run by the 8 consumer warps of every block (threads 0 .. 255); blocks past the work return at once.
// G: the register arrays' query heads (>= the model's group, a power of two: 4 or 8).
template <int G>
__device__ void attention_phase(const AttentionArgs& a, float* scratch, int* flag) {
  constexpr int D = kAttnD, DL = D / 32;  // value dims per lane
  constexpr int KP = D / 2 / 8;            // 16-byte pieces of half a key row (a lane's share)
  static_assert(DL == 4, "the value loop below takes 4 dims a lane");
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int KVH = a.n_kv_heads, GQ = a.n_heads / KVH;
  const int S = attention_splits(a.len, KVH, int(gridDim.x));
  const int unit = int(blockIdx.x);
  if (unit >= KVH * S) return;
  const int h = unit / S, s = unit % S;
  const int chunk = (a.len + S - 1) / S, p0 = s * chunk, p1 = min(a.len, p0 + chunk);
  const int64_t pos_stride = int64_t(KVH) * D;
  const bf16* kh = a.k + int64_t(h) * D;
  const bf16* vh = a.v + int64_t(h) * D;

  float* qs = scratch;              // (GQ, D) fp32
  float* wm = qs + GQ * D;          // (8, GQ) each warp's max
  float* wl = wm + 8 * GQ;          // (8, GQ) each warp's sum
  float* wacc = wl + 8 * GQ;        // (8, GQ, D) each warp's unnormalized output
  for (int i = tid; i < GQ * D / 8; i += 256) {
    unpack8(ld_cg16(a.q + int64_t(h) * GQ * D + 8 * i), qs + 8 * i);
  }
  consumers_sync(256);

  // This warp's positions [a0, a1), 16 at a time: lanes j and j + 16 score position base + j, each
  // over half the key row (one shuffle adds the halves); lane l sums dims 4l .. 4l + 3 of the values.
  // (Issuing the first group's loads before the queries are staged measured slower: the registers
  // held across the staging cost the rest of the kernel, session 19 run 11.)
  const int per = (p1 - p0 + 7) / 8, a0 = p0 + warp * per, a1 = min(p1, a0 + per);
  const int half = lane / 16, pl = lane % 16;
  float m[G], l[G], acc[G][DL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < DL; ++e) acc[g][e] = 0.0f;
  }
  for (int base = a0; base < a1; base += 16) {  // warp-uniform
    const int n = min(16, a1 - base);
    const bool valid = pl < n;
    // Every load of the 16 positions first (one memory round trip a group).
    uint4 kv[KP];
    if (valid) {
      const bf16* kr = kh + int64_t(base + pl) * pos_stride + half * (D / 2);
#pragma unroll
      for (int i = 0; i < KP; ++i) kv[i] = ld_cg16(kr + 8 * i);
    }
    uint2 vv[16];
#pragma unroll
    for (int j = 0; j < 16; ++j)
      vv[j] = j < n ? ld_cg8(vh + int64_t(base + j) * pos_stride + DL * lane) : make_uint2(0u, 0u);
    float sc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) sc[g] = 0.0f;
    if (valid) {
#pragma unroll
      for (int i = 0; i < KP; ++i) {
        float kf[8];
        unpack8(kv[i], kf);
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (g < GQ) {
            const float* qd = qs + g * D + half * (D / 2) + 8 * i;
            const float4 qa = *reinterpret_cast<const float4*>(qd);
            const float4 qb = *reinterpret_cast<const float4*>(qd + 4);
            sc[g] = fmaf(qa.x, kf[0], fmaf(qa.y, kf[1], fmaf(qa.z, kf[2], fmaf(qa.w, kf[3], sc[g]))));
            sc[g] = fmaf(qb.x, kf[4], fmaf(qb.y, kf[5], fmaf(qb.z, kf[6], fmaf(qb.w, kf[7], sc[g]))));
          }
      }
    }
    float pr[G];  // position pl's probability per head on lanes 0..15 (0 past the range and on 16..31)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      pr[g] = 0.0f;
      if (g >= GQ) continue;
      const float full = sc[g] + __shfl_xor_sync(0xffffffffu, sc[g], 16);
      const float x = valid ? full * a.scale_log2 : -INFINITY;
      const float mn = fmaxf(m[g], warp_max(x));  // finite: position base is valid
      const float corr = exp2_from(m[g], mn);
      pr[g] = valid && half == 0 ? exp2f(x - mn) : 0.0f;
      l[g] = l[g] * corr + warp_sum(pr[g]);
#pragma unroll
      for (int e = 0; e < DL; ++e) acc[g][e] *= corr;
      m[g] = mn;
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (j >= n) break;  // warp-uniform
      const float2 v01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vv[j].x));
      const float2 v23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vv[j].y));
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (g >= GQ) break;
        const float w = __shfl_sync(0xffffffffu, pr[g], j);
        acc[g][0] = fmaf(w, v01.x, acc[g][0]);
        acc[g][1] = fmaf(w, v01.y, acc[g][1]);
        acc[g][2] = fmaf(w, v23.x, acc[g][2]);
        acc[g][3] = fmaf(w, v23.y, acc[g][3]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g >= GQ) break;
    if (lane == 0) {
      wm[warp * GQ + g] = m[g];
      wl[warp * GQ + g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < DL; ++e) wacc[(warp * GQ + g) * D + DL * lane + e] = acc[g][e];
  }
  consumers_sync(256);

  // The block's (max, sum, output) per (head, dim) over its 8 warps; normalized and stored when the
  // block holds the whole cache, else written as this split's partial.
  float* part = a.ws + int64_t(unit) * GQ * (D + 2);
  for (int i = tid; i < GQ * D; i += 256) {
    const int g = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < 8; ++w) M = fmaxf(M, wm[w * GQ + g]);
    float L = 0.0f, O = 0.0f;
    for (int w = 0; w < 8; ++w) {
      const float f = exp2_from(wm[w * GQ + g], M);
      L = fmaf(wl[w * GQ + g], f, L);
      O = fmaf(wacc[(w * GQ + g) * D + d], f, O);
    }
    if (S == 1) {
      a.out[int64_t(h * GQ + g) * D + d] = __float2bfloat16(O / L);
    } else {
      part[g * (D + 2) + 2 + d] = O;
      if (d == 0) {
        part[g * (D + 2)] = M;
        part[g * (D + 2) + 1] = L;
      }
    }
  }
  if (S == 1) return;
  consumers_sync(256);
  if (tid == 0) {
    __threadfence();
    *flag = atomicAdd(a.head_done + h, 1u) == uint32_t(S - 1);
  }
  consumers_sync(256);
  if (!*flag) return;
  __threadfence();
  const float* parts = a.ws + int64_t(h) * S * GQ * (D + 2);  // the head's S partials, split order
  for (int i = tid; i < GQ * D; i += 256) {
    const int g = i / D, d = i % D;
    float M = -INFINITY;
    for (int j = 0; j < S; ++j) M = fmaxf(M, __ldcg(parts + (j * GQ + g) * (D + 2)));
    float L = 0.0f, O = 0.0f;
    for (int j = 0; j < S; ++j) {
      const float* pj = parts + (j * GQ + g) * (D + 2);
      const float f = exp2_from(__ldcg(pj), M);
      L = fmaf(__ldcg(pj + 1), f, L);
      O = fmaf(__ldcg(pj + 2 + d), f, O);
    }
    a.out[int64_t(h * GQ + g) * D + d] = __float2bfloat16(O / L);
  }
}

}  // namespace kiln::cuda::mk
