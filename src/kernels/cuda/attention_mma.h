// Tensor-core building blocks shared by the prefill and decode attention kernels (device code;
// included only by attention_*.cu). bf16 mma.sync m16n8k16 with fp32 accumulation, ldmatrix from
// XOR-swizzled shared tiles, cp.async (16-byte, zero-filled past the valid rows and dims).
//
// Shared tiles are (rows, D) bf16, D = 64 or 128 (head dims below D are zero-padded), a row is
// D / 8 chunks of 16 bytes and chunk c of row r is stored at chunk c ^ (r & 7): the 8 rows an
// ldmatrix phase reads hit 8 different 16-byte bank groups.
//
// Fragment layouts (lane = 4 g + t): A (16x16, row) a0 = (g, 2t..2t+1), a1 = (g+8, 2t..),
// a2 = (g, 2t+8..), a3 = (g+8, 2t+8..); B (16x8, col) b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g);
// C (16x8) c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.h"

namespace kiln::cuda::attn {

constexpr int kTileKv = 64;  // K/V positions per shared tile
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes = 0 fills zeros (src is not read, but must be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4 bytes (a scale) global -> shared through L1; zeros when !valid, as cp_async16.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a * b, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Element offset of (row, 8-wide chunk) in a swizzled (rows, D) tile.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Asynchronously loads rows [0, R) of a tile: row r comes from row_ptr(r) (a bf16 pointer, only
// called for valid rows), chunks at or past d / 8 and rows at or past n_rows are zero-filled.
// Row skip_row (if any) is left alone, not even zero-filled: a later copy writes it (the decode
// kernels' newest position, which the kernel before them writes; attention_decode_walk.cuh).
template <int D, int R, int kThreads, typename RowPtr>
__device__ __forceinline__ void load_tile_async(bf16* tile, int n_rows, int d, RowPtr row_ptr, const bf16* any,
                                                int tid, int skip_row = -1) {
  constexpr int kChunks = D / 8, kIters = (R * kChunks + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * kThreads + tid;
    if (R * kChunks % kThreads != 0 && i >= R * kChunks) break;
    const int r = i / kChunks, c = i % kChunks;
    if (r == skip_row) continue;
    const bool ok = r < n_rows && c * 8 < d;
    const bf16* src = ok ? row_ptr(r) + c * 8 : any;
    cp_async16(tile + swz<D>(r, c), src, ok);
  }
}
// The copying threads are the block's kThreads (tid = threadIdx.x; a warp's own tiles pass its lane).
template <int D, int R, int kThreads, typename RowPtr>
__device__ __forceinline__ void load_tile_async(bf16* tile, int n_rows, int d, RowPtr row_ptr, const bf16* any) {
  load_tile_async<D, R, kThreads>(tile, n_rows, d, row_ptr, any, int(threadIdx.x));
}

// Paged K/V tiles (kv_layout.h's paged form) of R positions: fetch() loads into registers the
// block ids of the rows this thread copies (one id per row, shared by K and V), load() issues the
// cp.async copies of a fetched tile. Callers fetch the ids of the tile after the one they load
// next, so the block-table latency overlaps a tile's compute instead of stalling the copies.
// Same zero-fill and skip_row rules as load_tile_async.
template <int D, int R, int kThreads>
struct PagedTileLoader {
  static constexpr int kChunks = D / 8, kIters = (R * kChunks + kThreads - 1) / kThreads;
  int32_t blk[kIters];
  int tid = int(threadIdx.x);  // this thread's index among the kThreads copying (a warp's own tiles: its lane)

  // bt: this sequence's block-table row; the tile holds positions p0 .. p0 + n_rows - 1.
  __device__ __forceinline__ void fetch(const int32_t* bt, int shift, int p0, int n_rows) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = it * kThreads + tid, r = i / kChunks;
      blk[it] = (i < R * kChunks && r < n_rows) ? __ldg(bt + ((p0 + r) >> shift)) : 0;
    }
  }

  __device__ __forceinline__ void load(bf16* k_tile, bf16* v_tile, const KvLayout& kv, int kv_head, int p0,
                                       int n_rows, int d, int skip_row = -1) const {
    const int mask = (1 << kv.block_shift) - 1;
    int64_t off[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = it * kThreads + tid, r = i / kChunks;
      const int64_t slot = (int64_t(blk[it]) << kv.block_shift) | ((p0 + r) & mask);
      off[it] = kv.slot_offset(slot, kv_head);
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = it * kThreads + tid;
      if (R * kChunks % kThreads != 0 && i >= R * kChunks) break;
      const int r = i / kChunks, c = i % kChunks;
      if (r == skip_row) continue;
      const bool ok = r < n_rows && c * 8 < d;
      cp_async16(k_tile + swz<D>(r, c), ok ? kv.k + off[it] + c * 8 : kv.k, ok);
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = it * kThreads + tid;
      if (R * kChunks % kThreads != 0 && i >= R * kChunks) break;
      const int r = i / kChunks, c = i % kChunks;
      if (r == skip_row) continue;
      const bool ok = r < n_rows && c * 8 < d;
      cp_async16(v_tile + swz<D>(r, c), ok ? kv.v + off[it] + c * 8 : kv.v, ok);
    }
  }
};

// Q fragments of this warp's 16 rows (starting at row0 of a swizzled (*, D) tile).
template <int D>
__device__ __forceinline__ void load_q_frags(uint32_t (&qf)[D / 16][4], const bf16* qs, int row0) {
  const int lane = threadIdx.x % 32;
  const int r = row0 + (lane & 15);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], qs + swz<D>(r, kk * 2 + (lane >> 4)));
}

// Q fragments from a q slot of 8 rows (the decode kernels' group of query heads): rows 8..15 of the
// mma tile repeat rows 0..7 (their results are never read), so no ldmatrix reads past the slot.
template <int D>
__device__ __forceinline__ void load_q_frags8(uint32_t (&qf)[D / 16][4], const bf16* qs) {
  const int lane = threadIdx.x % 32, r = lane & 7;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], qs + swz<D>(r, kk * 2 + (lane >> 4)));
}

// One warp: 16 query rows against keys [key0, key0 + N) of the shared K/V tiles, online softmax.
//   m[i]: running max of raw scores of row g + 8 i (quad-uniform), l[i]: this lane's partial sum
//   of exp (reduced over the quad only at the end), o: (16, D) accumulator in C layout.
//   visible(i, j, key): whether key `key` (tile-relative column) is visible to row g + 8 i;
//   called only when kMask. scale_log2 = softmax scale * log2(e).
template <int D, int N, bool kMask, typename Visible>
__device__ __forceinline__ void attend_tile(const uint32_t (&qf)[D / 16][4], const bf16* ks, const bf16* vs, int key0,
                                            float (&m)[2], float (&l)[2], float (&o)[D / 8][4], float scale_log2,
                                            Visible visible) {
  const int lane = threadIdx.x % 32, t = lane & 3;
  float s[N / 8][4];
#pragma unroll
  for (int j = 0; j < N / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  // S = Q K^T: ldmatrix.x4 of K gives the B fragments of two 8-key blocks for one 16-dim step.
  {
    const int key_in = (lane & 7) + ((lane >> 4) << 3), chunk_in = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < N / 16; ++j) {
        uint32_t b[4];
        ldmatrix_x4(b, ks + swz<D>(key0 + j * 16 + key_in, kk * 2 + chunk_in));
        mma_bf16(s[2 * j], qf[kk], b[0], b[1]);
        mma_bf16(s[2 * j + 1], qf[kk], b[2], b[3]);
      }
    }
  }
  if constexpr (kMask) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!visible(e >> 1, key0 + j * 8 + 2 * t + (e & 1))) s[j][e] = -INFINITY;
  }
  // Online softmax (two rows per lane; the 4 lanes of a quad share a row).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = m[i];
#pragma unroll
    for (int j = 0; j < N / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;  // a row with nothing visible yet
    const float corr = exp2f(m[i] * scale_log2 - base);          // m = -inf: 0 (o, l are 0 anyway)
    m[i] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      s[j][2 * i] = exp2f(fmaf(s[j][2 * i], scale_log2, -base));
      s[j][2 * i + 1] = exp2f(fmaf(s[j][2 * i + 1], scale_log2, -base));
      sum += s[j][2 * i] + s[j][2 * i + 1];
    }
    l[i] = l[i] * corr + sum;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][2 * i] *= corr, o[n][2 * i + 1] *= corr;
  }
  // O += P V: P from the S accumulators (A layout), V by ldmatrix.trans (two 8-dim blocks a load).
  {
    const int key_in = (lane & 7) + (((lane >> 3) & 1) << 3), chunk_in = lane >> 4;
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vs + swz<D>(key0 + kk * 16 + key_in, n * 2 + chunk_in));
        mma_bf16(o[2 * n], a, b[0], b[1]);
        mma_bf16(o[2 * n + 1], a, b[2], b[3]);
      }
    }
  }
}

// Sum of a per-lane value over the quad (the 4 lanes that share a row).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The decode kernels' merge of their 4 warps (each scored its own keys of every tile, with its own
// online softmax) through shared memory: ms / ls hold each warp's running max (log2 units, -inf
// for a warp that saw no key) and sum per query row, `rows` entries a warp, and os each warp's
// (rows, D) fp32 output. store_warp_state writes this warp's rows below `rows` (call it, then
// __syncthreads, then merge_warps for each (row, dim)).
template <int D>
__device__ __forceinline__ void store_warp_state(float* ms, float* ls, float* os, int rows, const float (&m)[2],
                                                 const float (&l)[2], const float (&o)[D / 8][4], float scale_log2) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float lsum = quad_sum(l[i]);
    const int r = g + 8 * i;
    if (r >= rows) continue;
    if (t == 0) {
      ms[warp * rows + r] = m[i] == -INFINITY ? -INFINITY : m[i] * scale_log2;
      ls[warp * rows + r] = lsum;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(os + (warp * rows + r) * D + n * 8 + 2 * t) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
  }
}

// Row r, dim c of the merged state: the max over the warps, sum of exp-weighted outputs and sums.
struct WarpMerge {
  float mx, num, den;
};
template <int D>
__device__ __forceinline__ WarpMerge merge_warps(const float* ms, const float* ls, const float* os, int rows, int r,
                                                 int c) {
  WarpMerge w{-INFINITY, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < 4; ++k) w.mx = fmaxf(w.mx, ms[k * rows + r]);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float e = exp2f(ms[k * rows + r] - w.mx);  // a warp that saw no key: 0
    w.num += e * os[(k * rows + r) * D + c];
    w.den += e * ls[k * rows + r];
  }
  return w;
}

// Whether the fast paths can read these pointers with 16-byte accesses.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline bool kv_fast_ok(const KvLayout& kv) {
  return aligned16(kv.k) && aligned16(kv.v) && kv.pos_stride % 8 == 0 && kv.seq_stride % 8 == 0 && kv.head_dim % 8 == 0;
}

}  // namespace kiln::cuda::attn
