#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pointwise_math.cuh"

namespace kiln::cuda {
namespace {

__global__ void embed_kernel(const bf16* __restrict__ table, const int32_t* __restrict__ tokens,
                             float* __restrict__ out, int64_t hidden) {
  const bf16* src = table + int64_t(tokens[blockIdx.x]) * hidden;  // (hidden)
  float* dst = out + int64_t(blockIdx.x) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = __bfloat162float(src[i]);
}

// Sum over the block; every thread gets the result. blockDim.x is a multiple of 32, <= 1024.
__device__ float block_sum(float v, float* scratch /* 32 floats */) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  int n_warps = blockDim.x / 32;
  v = lane < n_warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Four values of a row, x * scale * w, rounded to bf16 and packed (w: 4 bf16).
__device__ __forceinline__ uint2 normalized4(const float4 v, const uint2 w, float scale) {
  const float2 w01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.x));
  const float2 w23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.y));
  __nv_bfloat162 r01 = __floats2bfloat162_rn(v.x * scale * w01.x, v.y * scale * w01.y);
  __nv_bfloat162 r23 = __floats2bfloat162_rn(v.z * scale * w23.x, v.w * scale * w23.y);
  return make_uint2(*reinterpret_cast<uint32_t*>(&r01), *reinterpret_cast<uint32_t*>(&r23));
}

// One block per row. Two passes over x: the second re-reads it from L1/L2 (rows are <= 32 KB).
// Rows whose dim is a multiple of 4 (every model's) move x as float4 and w as 4 bf16 at a time:
// the scalar version reached 1.6 TB/s at prefill (38% of copy; H200 profile of pp2048).
__global__ void rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ delta, const bf16* __restrict__ w,
                               bf16* __restrict__ out, int64_t dim, float eps) {
  __shared__ float scratch[32];
  const bool vec = delta == nullptr && dim % 4 == 0;
  // One float4 of the row per thread (rmsnorm() sizes the block so for rows of up to 4096 values,
  // e.g. Llama-3-8B's, Qwen2.5-7B's 3584, SmolLM2's 576): the thread's 4 weights are a model
  // weight, which no kernel of the step writes, so they are loaded before the wait and their HBM
  // latency overlaps the kernel before this one instead of following the reduction; x is kept in
  // registers for the second pass. Same arithmetic as the loops below.
  const bool one_pass = vec && dim / 4 <= int64_t(blockDim.x);
  uint2 w_own = make_uint2(0, 0);
  if (one_pass && threadIdx.x < dim / 4) w_own = reinterpret_cast<const uint2*>(w)[threadIdx.x];
  // PDL (pdl.cuh): wait for the kernel that wrote x, then let the next one be scheduled while this
  // row is normalized. (Letting it be scheduled before the wait cost 13% of tg128: session 6.)
  pdl_wait();
  pdl_launch_dependents();
  float* xr = x + int64_t(blockIdx.x) * dim;
  bf16* o = out + int64_t(blockIdx.x) * dim;
  float ss = 0.0f;
  if (one_pass) {
    const bool mine = threadIdx.x < dim / 4;
    const float4 v = mine ? reinterpret_cast<const float4*>(xr)[threadIdx.x] : make_float4(0, 0, 0, 0);
    ss = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    const float scale = rsqrtf(block_sum(ss, scratch) / float(dim) + eps);
    if (!mine) return;
    reinterpret_cast<uint2*>(o)[threadIdx.x] = normalized4(v, w_own, scale);
    return;
  }
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < dim / 4; i += blockDim.x) {
      const float4 v = x4[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else if (delta) {
    const float* dr = delta + int64_t(blockIdx.x) * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      float v = xr[i] + dr[i];
      xr[i] = v;
      ss += v * v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  }
  float scale = rsqrtf(block_sum(ss, scratch) / float(dim) + eps);
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const uint2* w4 = reinterpret_cast<const uint2*>(w);
    uint2* o4 = reinterpret_cast<uint2*>(o);
    for (int64_t i = threadIdx.x; i < dim / 4; i += blockDim.x) {
      o4[i] = normalized4(x4[i], w4[i], scale);
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      o[i] = __float2bfloat16(xr[i] * scale * __bfloat162float(w[i]));
  }
}

// Max over the block; every thread gets the result (as block_sum; scratch may be block_sum's once
// every thread has read that sum: the __syncthreads below orders the reuse).
__device__ float block_max(float v, float* scratch /* 32 floats */) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // block_sum's readers of scratch are done
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  int n_warps = blockDim.x / 32;
  v = lane < n_warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Rows of up to kWideVec * kWideThreads float4 (4096 values): a 256-thread block per row, thread t
// holding float4s t, t + 256, .. (session 11). The one-pass path of rmsnorm_kernel gives a row a
// 1024-thread block, one float4 a thread: 2 rows resident per SM, 32 KB in flight, 19 us for
// 2048 x 4096 at prefill (2.5 TB/s, 61% of the roof). Here 6 rows are resident per SM (40
// registers a thread: 6 blocks of 256 fit the register file) with all their loads issued at once
// (96 KB in flight). The sum of squares replays the one-pass block's
// order (block_sum_replay), so a row gets the same bits from either kernel: rmsnorm picks by row
// count (a decode step's few rows keep the one-pass kernel, which measured ~1% faster at tg128) and
// a request's tokens do not depend on the batch it runs in.
// kFp8: the W8A8 quantization of the next projection fused: the row's bf16 outputs (the bits
// stored) -> their amax (a second block reduction) -> scale = amax / 448, q = e4m3(v * (448 / amax)),
// act_quant.cu's arithmetic, so q8 / s8 hold what rmsnorm then fp8_quantize_rows write. out may be
// null then (an fp8 layer reads only q8 / s8).
constexpr int kWideThreads = 256, kWideVec = 4;

// The threads rmsnorm gives rmsnorm_kernel's one-pass path for a row of n4 float4 (see rmsnorm()).
__host__ __device__ inline int one_pass_threads(int64_t n4) {
  const int64_t warps32 = (n4 + 31) / 32 * 32;
  return int(warps32 < 128 ? 128 : warps32);  // whole warps, at least 4
}

// block_sum as the one-pass kernel's block computes it, from 256 threads: thread (warp w', lane l)
// holds the squares of float4s 32 (w' + 8 i) + l, i.e. lane l of the one-pass block's warp
// w' + 8 i; each of those warps is reduced by the same butterfly, their sums go to scratch[w' + 8 i],
// and the sum over the one-pass block's warps (n_warps of them) is the same butterfly again.
__device__ float block_sum_replay(const float (&ss)[kWideVec], int n_warps, float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float v[kWideVec];
#pragma unroll
  for (int i = 0; i < kWideVec; ++i) v[i] = ss[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < kWideVec; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
#pragma unroll
  for (int i = 0; i < kWideVec; ++i)
    if (lane == 0 && warp + 8 * i < n_warps) scratch[warp + 8 * i] = v[i];
  __syncthreads();
  float t = lane < n_warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

template <bool kFp8>
__global__ void __launch_bounds__(kWideThreads) rmsnorm_wide_kernel(const float* x,
                                                                    const bf16* __restrict__ w, bf16* __restrict__ out,
                                                                    uint8_t* __restrict__ q8, float* __restrict__ s8,
                                                                    int64_t dim, float eps) {
  __shared__ float scratch[32];
  const int64_t n4 = dim / 4, row = blockIdx.x;
  uint2 wv[kWideVec];
#pragma unroll
  for (int i = 0; i < kWideVec; ++i) {
    const int64_t c = threadIdx.x + i * kWideThreads;
    wv[i] = c < n4 ? reinterpret_cast<const uint2*>(w)[c] : make_uint2(0, 0);  // a weight: before the wait
  }
  pdl_wait();
  pdl_launch_dependents();
  // x was written by the kernel before this one (the residual add): the coherent path after the
  // wait (pdl.cuh's ld_after_wait), never ld.global.nc.
  const float4* xr = reinterpret_cast<const float4*>(x + row * dim);
  float4 v[kWideVec];
#pragma unroll
  for (int i = 0; i < kWideVec; ++i) {
    const int64_t c = threadIdx.x + i * kWideThreads;
    const uint4 bits = ld_after_wait_if(xr + c, c < n4);
    v[i] = make_float4(__uint_as_float(bits.x), __uint_as_float(bits.y), __uint_as_float(bits.z), __uint_as_float(bits.w));
  }
  float ss[kWideVec];
#pragma unroll
  for (int i = 0; i < kWideVec; ++i) ss[i] = v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  const float scale = rsqrtf(block_sum_replay(ss, one_pass_threads(n4) / 32, scratch) / float(dim) + eps);
  uint2 packed[kWideVec];
#pragma unroll
  for (int i = 0; i < kWideVec; ++i) packed[i] = normalized4(v[i], wv[i], scale);
  if constexpr (!kFp8) {
#pragma unroll
    for (int i = 0; i < kWideVec; ++i) {
      const int64_t c = threadIdx.x + i * kWideThreads;
      if (c < n4) reinterpret_cast<uint2*>(out + row * dim)[c] = packed[i];
    }
  } else {
    float2 f[kWideVec][2];
    float local = 0.0f;
#pragma unroll
    for (int i = 0; i < kWideVec; ++i) {
      f[i][0] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed[i].x));
      f[i][1] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed[i].y));
      if (threadIdx.x + i * kWideThreads < n4)
        local = fmaxf(local, fmaxf(fmaxf(fabsf(f[i][0].x), fabsf(f[i][0].y)), fmaxf(fabsf(f[i][1].x), fabsf(f[i][1].y))));
    }
    const float amax = block_max(local, scratch);
    const float inv = amax > 0.0f ? __fdiv_rn(448.0f, amax) : 0.0f;
    if (threadIdx.x == 0) s8[row] = __fdiv_rn(amax, 448.0f);
#pragma unroll
    for (int i = 0; i < kWideVec; ++i) {
      const int64_t c = threadIdx.x + i * kWideThreads;
      if (c >= n4) continue;
      if (out) reinterpret_cast<uint2*>(out + row * dim)[c] = packed[i];
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(f[i][0].x, inv), __fmul_rn(f[i][0].y, inv)),
                                                   __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(f[i][1].x, inv), __fmul_rn(f[i][1].y, inv)),
                                                   __NV_SATFINITE, __NV_E4M3);
      reinterpret_cast<uint32_t*>(q8 + row * dim)[c] = lo | (hi << 16);
    }
  }
}

// One block per token; thread j rotates pair j % (rot_dim/2) of head j / (rot_dim/2), for all q and
// k heads at once (40 x 64 = 2560 pairs for Llama-3-8B: 2.5 per thread of a 1024-thread block).
// The first version gave each thread one pair for every head in turn: 40 dependent
// load-rotate-store rounds (the stores to the cache may alias the qkv loads, so the compiler cannot
// batch the loads), 10.8 us per call at one token, 6.4% of a batch-1 decode step (H200, CUPTI).
// Angles from the backend's (cos, sin) table (rope_table_fill), or computed in double, reduced mod
// 2 pi, past its end or without one: fp32 pos * freq loses digits at long context (the CPU reference
// does the same). Computing them here, per (token, head, pair), cost 69.6 us a call at prefill of
// 2048 tokens (723 GB/s, 4.2% of the step; H200 profile) for 40x redundant FP64 fmods and sincos.
// kSlots: K/V rows go to slots of a paged pool (the batched path); otherwise to (sequence,
// position) of a contiguous cache, with the contiguous address computed at compile time: this
// kernel is latency-bound at one token, and a runtime choice of addressing in its inner loop cost
// 45% (13.6 -> 19.7 µs per call, 0.2 ms of a decode step, measured on the H200).
constexpr int kRopeThreads = 1024;
template <bool kSlots>
__global__ void __launch_bounds__(kRopeThreads)
    rope_qkv_kernel(const bf16* __restrict__ qkv, const int32_t* __restrict__ positions,
                    const int32_t* __restrict__ seq_ids, const int32_t* __restrict__ slots,
                    const float* __restrict__ inv_freq, const float2* __restrict__ cos_sin, int64_t cos_sin_positions,
                    int rot_dim, bool interleaved, int n_heads, int n_kv_heads, int head_dim, bf16* __restrict__ q_out,
                    KvLayout kv) {
  pdl_wait();  // qkv comes from the GEMV before this kernel
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
  const bf16* row = qkv + int64_t(t) * (q_dim + 2 * kv_dim);  // [q | k | v]
  const int64_t pos = positions[t];
  const int seq = seq_ids ? seq_ids[t] : 0;
  // Where K/V head h of this token goes: by slot (paged pool) or by (sequence, position).
  const int64_t slot = kSlots ? int64_t(slots[t]) : -1;
  auto kv_at = [&](int h) {
    if constexpr (kSlots) {
      return kv.slot_offset(slot, h);
    } else {
      return kv.offset_as<false>(seq, pos, h);
    }
  };
  bf16* qo = q_out + int64_t(t) * q_dim;
  auto dst_of = [&](int h) { return h < n_heads ? qo + h * head_dim : kv.k + kv_at(h - n_heads); };
  const int half = rot_dim / 2, heads = n_heads + n_kv_heads;

  for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int h = j / half, i = j - h * half;
    float s, c;
    rope_sincos_cached(cos_sin, cos_sin_positions, half, pos, i, inv_freq, s, c);
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const bf16* src = row + h * head_dim;  // q heads, then k heads: contiguous in the row
    const float x0 = __bfloat162float(src[a]), x1 = __bfloat162float(src[b]);
    bf16* dst = dst_of(h);
    dst[a] = __float2bfloat16(rope_a(x0, x1, s, c));
    dst[b] = __float2bfloat16(rope_b(x0, x1, s, c));
  }
  // Dimensions past rot_dim pass through; v is copied into the cache.
  const int pass = head_dim - rot_dim;
  for (int j = threadIdx.x; j < heads * pass; j += blockDim.x) {
    const int h = j / pass, d = rot_dim + j - h * pass;
    dst_of(h)[d] = row[h * head_dim + d];
  }
  for (int j = threadIdx.x; j < kv_dim; j += blockDim.x) {
    const int h = j / head_dim, d = j - h * head_dim;
    kv.v[kv_at(h) + d] = row[q_dim + kv_dim + j];
  }
}

// The many-token variant (rope_qkv_slots, and since session 10 rope_qkv, with n >=
// kRopeVecMinTokens and full-width rotation): one thread per 16 bytes. The per-token kernel above
// gives a 1024-thread block 2.5 scalar pairs a thread (its shape is for one-token latency); at 2048
// tokens it ran at 1128 GB/s, 27% of the copy ceiling (44.6 us a layer, 2.9% of the pp2048 step,
// H200 profile). Items of a token: the rotated
// q and k heads (interleaved: 8 elements = 4 adjacent pairs; halves: pairs i0 .. i0 + 7, i.e. 8
// elements of each half), then v in 8-element copies. Same arithmetic as the scalar kernel per
// element, so the results are bit-identical.
constexpr int kRopeVecThreads = 256;


// kSlots: K/V rows by slot of a paged pool (the batched steps); else at (seq_ids[t] or 0, position)
// of a contiguous cache (a prompt's prefill chunk: 1439 us a pp2048 step through the per-token
// kernel, 27% of the copy roof, session 9 profile).
template <bool kSlots>
__global__ void __launch_bounds__(kRopeVecThreads)
    rope_qkv_vec_kernel(const bf16* __restrict__ qkv, const int32_t* __restrict__ positions,
                        const int32_t* __restrict__ seq_ids, const int32_t* __restrict__ slots,
                        const float* __restrict__ inv_freq, const float2* __restrict__ cos_sin,
                        int64_t cos_sin_positions, int64_t n, bool interleaved, int n_heads, int n_kv_heads,
                        int head_dim, bf16* __restrict__ q_out, KvLayout kv) {
  pdl_wait();  // qkv comes from the GEMM before this kernel
  pdl_launch_dependents();
  const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim, half = head_dim / 2;
  const int rot_items = rope_vec_rot_items(n_heads + n_kv_heads, head_dim, interleaved);
  const int per_token = rot_items + kv_dim / 8;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * per_token) return;
  const int64_t t = idx / per_token;
  const int item = int(idx - t * per_token);
  const bf16* row = qkv + t * (q_dim + 2 * kv_dim);  // [q | k | v]
  const int64_t pos = positions[t];
  const int64_t slot = kSlots ? int64_t(slots[t]) : -1;
  const int seq = !kSlots && seq_ids ? seq_ids[t] : 0;
  auto kv_at = [&](int h) {
    if constexpr (kSlots) {
      return kv.slot_offset(slot, h);
    } else {
      return kv.offset_as<false>(seq, pos, h);
    }
  };
  if (item >= rot_items) {  // v: copied into the cache
    const int j = (item - rot_items) * 8, h = j / head_dim;
    *reinterpret_cast<uint4*>(kv.v + kv_at(h) + (j - h * head_dim)) =
        *reinterpret_cast<const uint4*>(row + q_dim + kv_dim + j);
    return;
  }
  const int e = item * 8;  // its first element (interleaved) or pair (halves) over all rotated heads
  // interleaved: elements e .. e + 7 of head h; halves: pairs i0 .. i0 + 7 of head h
  const int h = interleaved ? e / head_dim : e / half;
  const int d0 = interleaved ? e - h * head_dim : e - h * half;
  const bf16* src = row + h * head_dim;
  bf16* dst = h < n_heads ? q_out + t * q_dim + h * head_dim : kv.k + kv_at(h - n_heads);
  float oa[8], ob[8];
  rope_item(src, d0, half, interleaved, pos, cos_sin, cos_sin_positions, inv_freq, oa, ob);
  *reinterpret_cast<uint4*>(dst + d0) = float_to_bf16x8(oa);
  if (!interleaved) *reinterpret_cast<uint4*>(dst + half + d0) = float_to_bf16x8(ob);
}

__global__ void rope_table_kernel(float2* __restrict__ cos_sin, int64_t total, const float* __restrict__ inv_freq,
                                  int half) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < total; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pos = j / half;
    float s, c;
    rope_sincos(pos, inv_freq[j - pos * half], s, c);
    cos_sin[j] = make_float2(c, s);
  }
}

__global__ void gather_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ rows,
                                   float* __restrict__ dst, int64_t dim) {
  const float* s = src + int64_t(rows[blockIdx.x]) * dim;  // (dim)
  float* d = dst + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) d[i] = s[i];
}

// out(r, c) = silu(gate(r, c)) * up(r, c), gate_up = [gate | up] per row. Eight columns per thread
// with 16-byte loads when inter % 8 == 0: the element-per-thread version ran at 1.2 TB/s at
// prefill (4.6 ms of a 70 ms pp2048 step, H200 profile).
template <bool kVec8>
// gate_up is read after pdl_wait through the coherent path (ld_after_wait; no __restrict__ on it,
// so the scalar path is no ld.global.nc either): its writer was still running when this kernel
// started (pdl.cuh).
__global__ void silu_mul_kernel(const bf16* gate_up, bf16* __restrict__ out, int64_t rows, int64_t inter) {
  pdl_wait();  // as rmsnorm: the down GEMV after this one is scheduled early
  pdl_launch_dependents();
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  if constexpr (kVec8) {
    const int64_t groups = inter / 8, total = rows * groups;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += step) {
      const int64_t r = i / groups, c = (i - r * groups) * 8;
      const uint4 g = ld_after_wait(gate_up + r * 2 * inter + c);
      const uint4 u = ld_after_wait(gate_up + r * 2 * inter + inter + c);
      const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
      const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&u);
      uint4 res;
      __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&res);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 gf = __bfloat1622float2(g2[k]), uf = __bfloat1622float2(u2[k]);
        r2[k] = __floats2bfloat162_rn(silu_mul_value(gf.x, uf.x), silu_mul_value(gf.y, uf.y));
      }
      *reinterpret_cast<uint4*>(out + r * inter + c) = res;
    }
  } else {
    const int64_t total = rows * inter;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += step) {
      int64_t r = i / inter, c = i - r * inter;
      float g = __bfloat162float(gate_up[r * 2 * inter + c]);
      float u = __bfloat162float(gate_up[r * 2 * inter + inter + c]);
      out[i] = __float2bfloat16(silu_mul_value(g, u));
    }
  }
}

}  // namespace

void embed_gather(const bf16* table, const int32_t* tokens, float* out, int64_t n, int64_t hidden,
                  cudaStream_t stream) {
  if (n == 0) return;
  embed_kernel<<<unsigned(n), 256, 0, stream>>>(table, tokens, out, hidden);
  KILN_CUDA_CHECK_LAUNCH();
}

namespace {
// Whether rmsnorm_wide_kernel can take rows of dim (KILN_RMSNORM_WIDE=0: never, for same-run
// comparison; its rows then go to rmsnorm_kernel, with the same bits).
bool rmsnorm_wide(int64_t dim) {
  static const bool on = env_switch_on("KILN_RMSNORM_WIDE");
  return on && dim % 4 == 0 && dim >= 4 && dim / 4 <= int64_t(kWideVec) * kWideThreads;
}
// From this many rows rmsnorm takes the wide kernel (prefill chunks, batched decode); below, the
// one-pass kernel (a decode step's rows: one 1024-thread block a row has the shorter latency).
constexpr int64_t kWideMinRows = 17;
}  // namespace

void rmsnorm(float* x, const float* delta, const bf16* weight, bf16* out, int64_t rows, int64_t dim, float eps,
             cudaStream_t stream) {
  if (rows == 0) return;
  if (delta == nullptr && rows >= kWideMinRows && rmsnorm_wide(dim) && rows < (int64_t(1) << 31)) {
    launch_pdl(rmsnorm_wide_kernel<false>, dim3(unsigned(rows)), dim3(kWideThreads), 0, stream,
               static_cast<const float*>(x), weight, out, static_cast<uint8_t*>(nullptr), static_cast<float*>(nullptr),
               dim, eps);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  // One float4 a thread up to 4096 values (rmsnorm_kernel's one-pass path: the weights loaded before
  // its wait), at least 4 warps; longer or odd rows loop.
  const int threads = dim % 4 == 0 && dim <= 4096 ? one_pass_threads(dim / 4)
                      : dim >= 4096                ? 1024
                      : dim >= 1024                ? 512
                                                   : 128;
  launch_pdl(rmsnorm_kernel, dim3(unsigned(rows)), dim3(threads), 0, stream, x, delta, weight, out, dim, eps);
  KILN_CUDA_CHECK_LAUNCH();
}

bool rmsnorm_fp8_fusable(int64_t dim) { return rmsnorm_wide(dim); }

bool rmsnorm_fp8(const float* x, const bf16* weight, bf16* out, uint8_t* q8, float* s8, int64_t rows, int64_t dim,
                 float eps, cudaStream_t stream) {
  if (!rmsnorm_fp8_fusable(dim) || rows >= (int64_t(1) << 31)) return false;
  if (rows == 0) return true;
  launch_pdl(rmsnorm_wide_kernel<true>, dim3(unsigned(rows)), dim3(kWideThreads), 0, stream, x, weight, out, q8, s8,
             dim, eps);
  KILN_CUDA_CHECK_LAUNCH();
  return true;
}

namespace {
// The grid of rope_qkv_vec_kernel for these n tokens, or 0 blocks where it does not take them: too
// few tokens, partial rotation, a 16-byte vector that would straddle (the cache's rows and
// sequences must be whole multiples of 8 elements, every base 16-byte aligned), or a grid past
// 2^31 blocks. KILN_ROPE_VEC=0 keeps the per-token kernel (for same-run comparison).
dim3 rope_vec_grid(int64_t n, int rot_dim, bool interleaved, int n_heads, int n_kv_heads, int head_dim,
                   const KvLayout& kv, const bf16* qkv, const bf16* q_out) {
  static const bool vec_on = env_switch_on("KILN_ROPE_VEC");
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const bool ok = vec_on && n >= kRopeVecMinTokens && rot_dim == head_dim && head_dim % 16 == 0 &&
                  kv.head_dim == head_dim && kv.pos_stride % 8 == 0 && (kv.paged() || kv.seq_stride % 8 == 0) &&
                  aligned(qkv) && aligned(q_out) && aligned(kv.k) && aligned(kv.v);
  if (!ok) return dim3(0);
  const int64_t per_token = rope_vec_rot_items(n_heads + n_kv_heads, head_dim, interleaved) + n_kv_heads * head_dim / 8;
  const int64_t blocks = (n * per_token + kRopeVecThreads - 1) / kRopeVecThreads;
  return blocks < (int64_t(1) << 31) ? dim3(unsigned(blocks)) : dim3(0);
}
}  // namespace

void rope_qkv(const bf16* qkv, const int32_t* positions, const int32_t* seq_ids, int64_t n, const float* inv_freq,
              int rot_dim, bool interleaved, int n_heads, int n_kv_heads, int head_dim, bf16* q_out, KvLayout kv,
              cudaStream_t stream, const float2* cos_sin, int64_t cos_sin_positions) {
  if (n == 0) return;
  KILN_CUDA_REQUIRE(!kv.paged(), "rope_qkv writes a contiguous cache; a paged pool goes through rope_qkv_slots");
  if (kv.quantized()) {  // RoPE, then the 8-bit K/V write (kv_quant.h)
    KILN_CUDA_REQUIRE(seq_ids == nullptr, "rope_qkv: a quantized contiguous cache is written for sequence 0 only");
    return rope_qkv_quant(qkv, positions, nullptr, n, inv_freq, rot_dim, interleaved, n_heads, n_kv_heads, head_dim,
                          q_out, kv, stream, cos_sin, cos_sin_positions);
  }
  if (const dim3 grid = rope_vec_grid(n, rot_dim, interleaved, n_heads, n_kv_heads, head_dim, kv, qkv, q_out);
      grid.x > 0) {
    launch_pdl(rope_qkv_vec_kernel<false>, grid, dim3(kRopeVecThreads), 0, stream, qkv, positions, seq_ids,
               static_cast<const int32_t*>(nullptr), inv_freq, cos_sin, cos_sin_positions, n, interleaved, n_heads,
               n_kv_heads, head_dim, q_out, kv);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  launch_pdl(rope_qkv_kernel<false>, dim3(unsigned(n)), dim3(kRopeThreads), 0, stream, qkv, positions, seq_ids,
             static_cast<const int32_t*>(nullptr), inv_freq, cos_sin, cos_sin_positions, rot_dim, interleaved, n_heads,
             n_kv_heads, head_dim, q_out, kv);
  KILN_CUDA_CHECK_LAUNCH();
}

void rope_qkv_slots(const bf16* qkv, const int32_t* positions, const int32_t* slots, int64_t n, const float* inv_freq,
                    int rot_dim, bool interleaved, int n_heads, int n_kv_heads, int head_dim, bf16* q_out, KvLayout pool,
                    cudaStream_t stream, const float2* cos_sin, int64_t cos_sin_positions) {
  if (n == 0) return;
  KILN_CUDA_REQUIRE(slots != nullptr, "rope_qkv_slots: slots are required");
  if (pool.quantized())  // RoPE, then the 8-bit K/V write (kv_quant.h)
    return rope_qkv_quant(qkv, positions, slots, n, inv_freq, rot_dim, interleaved, n_heads, n_kv_heads, head_dim,
                          q_out, pool, stream, cos_sin, cos_sin_positions);
  KILN_CUDA_REQUIRE(n < (int64_t(1) << 31), "rope_qkv_slots: too many tokens");
  if (const dim3 grid = rope_vec_grid(n, rot_dim, interleaved, n_heads, n_kv_heads, head_dim, pool, qkv, q_out);
      grid.x > 0) {
    launch_pdl(rope_qkv_vec_kernel<true>, grid, dim3(kRopeVecThreads), 0, stream, qkv, positions,
               static_cast<const int32_t*>(nullptr), slots, inv_freq, cos_sin, cos_sin_positions, n, interleaved,
               n_heads, n_kv_heads, head_dim, q_out, pool);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  launch_pdl(rope_qkv_kernel<true>, dim3(unsigned(n)), dim3(kRopeThreads), 0, stream, qkv, positions,
             static_cast<const int32_t*>(nullptr), slots, inv_freq, cos_sin, cos_sin_positions, rot_dim, interleaved,
             n_heads, n_kv_heads, head_dim, q_out, pool);
  KILN_CUDA_CHECK_LAUNCH();
}

void rope_table_fill(float2* cos_sin, int64_t positions, const float* inv_freq, int rot_dim, cudaStream_t stream) {
  const int64_t total = positions * (rot_dim / 2);
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 65535);
  rope_table_kernel<<<unsigned(blocks), 256, 0, stream>>>(cos_sin, total, inv_freq, rot_dim / 2);
  KILN_CUDA_CHECK_LAUNCH();
}

void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t dim, cudaStream_t stream) {
  if (n == 0) return;
  gather_rows_kernel<<<unsigned(n), 256, 0, stream>>>(src, rows, dst, dim);
  KILN_CUDA_CHECK_LAUNCH();
}

void silu_mul(const bf16* gate_up, bf16* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  const bool vec8 = inter % 8 == 0;
  const int64_t items = rows * (vec8 ? inter / 8 : inter);
  if (items == 0) return;
  const int64_t blocks = (items + 255) / 256;
  const dim3 grid(unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8));
  if (vec8)
    launch_pdl(silu_mul_kernel<true>, grid, dim3(256), 0, stream, gate_up, out, rows, inter);
  else
    launch_pdl(silu_mul_kernel<false>, grid, dim3(256), 0, stream, gate_up, out, rows, inter);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
