// The qkv GEMM's RoPE epilogue (session 35; matmul.h's gemm_rope_kv): the persistent GEMM's
// 128x256 tile (config 4's) stages its bf16 products as config 4 stores them (stage_block_bf16),
// and instead of storing the (M, q_dim + 2 kv_dim) qkv rows, an epilogue warp per consumer half
// reads the 64 staged rows back from shared memory and does rope_qkv's work on them: q rotated into
// q_out, K rotated and V copied (or, for an 8-bit cache, quantized with one scale per (token, KV
// head)) into the cache.
//
// Why: in a 2048-row decode step of issue #8's run the stand-alone rope_qkv kernel reads the qkv
// rows back from memory (25 MB a layer) and writes q and K/V (21 MB) at ~55% of the copy
// bandwidth, 0.7 ms of a ~56 ms step; an admission step (8192 rows) spends ~2.7 ms in it.
//
// Who does it (docs/performance/gemm.md, session 35): the consumer warpgroups themselves, first
// (the tensor cores idle meanwhile): the GEMM grew 1.1 ms a 2048-row step, more than rope_qkv
// costs, with the loads batched as much as without. Now warps 2 and 3 of the producer warpgroup
// (idle: one thread issues the TMA loads) take a consumer half each, handed over by two mbarrier
// pairs (staged / read), while the consumers run the next tile's main loop; only the last tile's
// epilogue is exposed.
//
// Numerics: the staged values are the bf16 products the unfused GEMM stores (the same tiles, the
// same rounding), and each 16-byte item is rotated and encoded by the same functions the 16-byte
// rope kernels use (rope_rotate8, kvq::scale_of / encode8): q, the cache's bytes and its scales
// are the unfused path's bits (tests/gpu/gemm_rope_test.cpp compares them).
//
// Work split: a tile's 256 columns lie in one of q, k or v (the host checks that q_dim and kv_dim
// are multiples of 256, and that head_dim divides 256). A row's items are 16-byte chunks: 32 a row
// (interleaved pairs, or V), or 16 (rotate-half pairs: chunk d0 and chunk half + d0 of a head, one
// item). Consecutive lanes take consecutive items of a row, so a head's items are an aligned group
// of lanes and its amax is kvq::group_max's shuffles; each lane keeps its item column over every
// 1st or 2nd row. The warp loads its 64 rows' positions and slots (two a lane) before it waits for
// the staged half, and (cos, sin) a row or two ahead (more rows at once spilled within the 120
// registers the warp has).
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/pointwise_math.cuh"
#include "kernels/cuda/rope_kv_target.h"
#include "kernels/cuda/wgmma_ptx.cuh"  // KILN_WGMMA_DEVICE

namespace kiln::cuda::rope_epilogue {
constexpr int kTileCols = 256;  // the 128x256 tile's columns: whole heads of q, k or v (the host checks)
}

#ifdef KILN_WGMMA_DEVICE
namespace kiln::cuda::rope_epilogue {

// Chunk q (columns 8q .. 8q + 7) of row r of a consumer's staged (64, 256) block: four (64, 64)
// boxes of 8 KB, 128-byte rows, chunk q % 8 of row r at position (q % 8) ^ (r % 8) (the 128B
// swizzle stage_block_bf16 writes). volatile keeps it after the mbarrier wait that hands the warp
// the block; no memory clobber, so the global loads of (cos, sin) may be issued early.
__device__ __forceinline__ uint4 staged_chunk(uint32_t sc, int r, int q) {
  const uint32_t addr = sc + uint32_t(q / 8) * 8192u + uint32_t(r) * 128u + uint32_t(((q % 8) ^ (r % 8)) * 16);
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// The (cos, sin) pairs i0 .. i0 + kPairs - 1 of position pos: from rope_table_fill's table in
// 16-byte loads where it holds the position (i0 is a multiple of 4: 32-byte aligned), else
// computed; rope_sincos_cached's values either way.
template <int kPairs>
__device__ __forceinline__ void cos_sin_of(const RopeKvTarget& t, int half, int64_t pos, int i0, float2* cs) {
  if (pos < t.cos_sin_positions) {
    const float4* src = reinterpret_cast<const float4*>(t.cos_sin + pos * half + i0);
#pragma unroll
    for (int p = 0; p < kPairs / 2; ++p) {
      const float4 v = __ldg(src + p);
      cs[2 * p] = make_float2(v.x, v.y);
      cs[2 * p + 1] = make_float2(v.z, v.w);
    }
  } else {
#pragma unroll
    for (int p = 0; p < kPairs; ++p) rope_sincos(pos, t.inv_freq[i0 + p], cs[p].y, cs[p].x);
  }
}

// Row r's (0..63) value of a per-row int that a warp holds two to a lane (rows lane and 32 + lane).
__device__ __forceinline__ int32_t row_value(int32_t lo, int32_t hi, int r) {
  const int32_t a = __shfl_sync(0xffffffffu, lo, r & 31), b = __shfl_sync(0xffffffffu, hi, r & 31);
  return r < 32 ? a : b;
}

// The block's rows' positions and slots (rows row0 + lane and row0 + 32 + lane; 0 past M), loaded
// by the warp before it waits for the staged block.
struct RowsMeta {
  int32_t pos_lo = 0, pos_hi = 0, slot_lo = 0, slot_hi = 0;
};
__device__ __forceinline__ RowsMeta rows_meta(const RopeKvTarget& t, int64_t row0, int64_t M, int lane) {
  RowsMeta m;
  const int64_t lo = row0 + lane, hi = row0 + 32 + lane;
  if (lo < M) m.pos_lo = t.position[lo], m.slot_lo = t.slot ? t.slot[lo] : 0;
  if (hi < M) m.pos_hi = t.position[hi], m.slot_hi = t.slot ? t.slot[hi] : 0;
  return m;
}

// Where a token's KV head goes: its element offset (bf16 cache) or vector number (8-bit cache), by
// slot (a pool) or by position (sequence 0 of a contiguous cache).
template <KvQuant KV>
__device__ __forceinline__ int64_t kv_index(const RopeKvTarget& t, int32_t slot, int64_t pos, int h) {
  if constexpr (KV == KvQuant::none)
    return t.slot ? t.kv.slot_offset(slot, h) : t.kv.offset_as<false>(0, pos, h);
  else
    return t.slot ? t.kv.slot_quant_index(slot, h) : t.kv.quant_index_as<false>(0, pos, h);
}

// A (token, KV head) vector's 8-bit write: the amax over the head's group of lanes (every lane
// takes part; a group is one row's head, all dead or all live), then this lane's 8 (and, for
// rotate-half K, 8 more) values and, from the group's first lane, the scale.
template <KvQuant KV>
__device__ __forceinline__ void write_quantized(const float* oa, const float* ob, bool two, int group, bool live,
                                                uint8_t* bytes, float* scales, int64_t vec, int d0, int half, int hd) {
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(oa[e]));
  if (two) {
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(ob[e]));
  }
  amax = kvq::group_max(amax, group);
  if (!live) return;
  float scale, inv;
  kvq::scale_of<KV>(amax, scale, inv);
  uint8_t* dst = bytes + vec * hd;
  *reinterpret_cast<uint2*>(dst + d0) = kvq::encode8<KV>(oa, inv);
  if (two) *reinterpret_cast<uint2*>(dst + half + d0) = kvq::encode8<KV>(ob, inv);
  if (d0 == 0) scales[vec] = scale;
}

// The q or k block (its first head head0 of the region). Each lane keeps one item column (kHalves:
// 16 a row, 8 pairs each; interleaved: 32, 4 pairs each) over every kRowStep-th row, and loads
// the (cos, sin) of kBatch rows before rotating them, so their latencies overlap.
template <KvQuant KV, bool kHalves>
__device__ __forceinline__ void rope_rotated(int lane, uint32_t sc, int64_t row0, int64_t M, bool is_k, int head0,
                                             const RopeKvTarget& t, const RowsMeta& rm) {
  constexpr int kPerRow = kHalves ? kTileCols / 16 : kTileCols / 8, kRowStep = 32 / kPerRow;
  constexpr int kRows = 64 / kRowStep, kPairs = kHalves ? 8 : 4, kBatch = kHalves ? 1 : 2;
  const int hd = t.head_dim, half = hd / 2, per_head = kHalves ? hd / 16 : hd / 8;
  const int item = lane % kPerRow, h = item / per_head, d0 = (item - h * per_head) * 8, r0 = lane / kPerRow;
  const int chunk = (h * hd + d0) / 8, i0 = kHalves ? d0 : d0 / 2;
  const int64_t q_dim = int64_t(t.n_heads) * hd;
#pragma unroll 1
  for (int b = 0; b < kRows; b += kBatch) {
    int64_t pos[kBatch];
    float2 cs[kBatch][kPairs];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) pos[u] = row_value(rm.pos_lo, rm.pos_hi, r0 + (b + u) * kRowStep);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) cos_sin_of<kPairs>(t, half, pos[u], i0, cs[u]);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int r = r0 + (b + u) * kRowStep;
      const int64_t row = row0 + r;
      const bool live = row < M;
      const int32_t slot = row_value(rm.slot_lo, rm.slot_hi, r);
      float a[8], bv[8], oa[8], ob[8];
      bf16x8_to_float(staged_chunk(sc, r, chunk), a);
      if (kHalves) bf16x8_to_float(staged_chunk(sc, r, chunk + half / 8), bv);
      rope_rotate8(a, bv, cs[u], !kHalves, oa, ob);
      if (!is_k) {  // q: bf16, as rope_qkv writes it
        if (live) {
          bf16* dst = t.q_out + row * q_dim + int64_t(head0 + h) * hd;
          *reinterpret_cast<uint4*>(dst + d0) = float_to_bf16x8(oa);
          if (kHalves) *reinterpret_cast<uint4*>(dst + half + d0) = float_to_bf16x8(ob);
        }
      } else if constexpr (KV == KvQuant::none) {
        if (live) {
          bf16* dst = t.kv.k + kv_index<KV>(t, slot, pos[u], head0 + h);
          *reinterpret_cast<uint4*>(dst + d0) = float_to_bf16x8(oa);
          if (kHalves) *reinterpret_cast<uint4*>(dst + half + d0) = float_to_bf16x8(ob);
        }
      } else {
        const int64_t vec = live ? kv_index<KV>(t, slot, pos[u], head0 + h) : 0;
        write_quantized<KV>(oa, ob, kHalves, per_head, live, t.kv.k8, t.kv.k_scale, vec, d0, half, hd);
      }
    }
  }
}

// The v block: 32 items a row (8 values each, one a lane), copied (bf16 cache) or quantized per head.
template <KvQuant KV>
__device__ __forceinline__ void rope_v(int lane, uint32_t sc, int64_t row0, int64_t M, int head0,
                                       const RopeKvTarget& t, const RowsMeta& rm) {
  const int hd = t.head_dim, per_head = hd / 8;
  const int h = lane / per_head, d0 = (lane - h * per_head) * 8;
#pragma unroll 2
  for (int r = 0; r < 64; ++r) {
    const bool live = row0 + r < M;
    const int64_t at =
        kv_index<KV>(t, row_value(rm.slot_lo, rm.slot_hi, r), row_value(rm.pos_lo, rm.pos_hi, r), head0 + h);
    const uint4 ua = staged_chunk(sc, r, lane);
    if constexpr (KV == KvQuant::none) {
      if (live) *reinterpret_cast<uint4*>(t.kv.v + at + d0) = ua;  // V as it is
    } else {
      float oa[8];
      bf16x8_to_float(ua, oa);
      write_quantized<KV>(oa, oa, false, per_head, live, t.kv.v8, t.kv.v_scale, live ? at : 0, d0, 0, hd);
    }
  }
}

// One consumer's 64 staged rows (rows row0 .. of the product, those < M written), columns n0 ..
// n0 + 255 of [q | k | v], by one warp. KV: the cache's form (KvQuant::none: bf16).
template <KvQuant KV>
__device__ __forceinline__ void rope_block(int lane, uint32_t sc, int64_t row0, int64_t n0, int64_t M,
                                           const RopeKvTarget& t, const RowsMeta& rm) {
  const int hd = t.head_dim;
  const int64_t q_dim = int64_t(t.n_heads) * hd, kv_dim = int64_t(t.n_kv_heads) * hd;
  const int region = n0 < q_dim ? 0 : n0 < q_dim + kv_dim ? 1 : 2;  // q, k, v
  const int head0 = int((n0 - (region == 0 ? 0 : region == 1 ? q_dim : q_dim + kv_dim)) / hd);
  if (region == 2)
    rope_v<KV>(lane, sc, row0, M, head0, t, rm);
  else if (t.interleaved)
    rope_rotated<KV, false>(lane, sc, row0, M, region == 1, head0, t, rm);
  else
    rope_rotated<KV, true>(lane, sc, row0, M, region == 1, head0, t, rm);
}

}  // namespace kiln::cuda::rope_epilogue
#endif  // KILN_WGMMA_DEVICE
