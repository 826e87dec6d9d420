// The ends of the tensor-core decode GEMVs: which 16 weight rows a 16-row tile multiplies (two runs
// of 8, lo0 + 0..7 and hi0 + 0..7) and what happens to the tile's results. StoreRows is the plain
// product; the pairing epilogues of the fused decode GEMVs (gemv_fused.h) choose the runs so both
// values of a RoPE pair or a gate/up pair land in one warp. Shared by the bf16 GEMV (gemv_mma.cuh,
// gemv_fused.cu) and the int8 / int4 GEMV (quant/qgemv_v3.cu); all sum bias and the warps'
// partials in the same order, so each format's fused forms compute its unfused kernels' bits --
// except with a NormApply (the folded RMSNorm, gemv_fused.h), which scales the partials' sum. An
// epilogue's finish starts with a __syncthreads (the per-warp partials in `red` are complete) and
// leaves the caller to synchronize again before `red` is reused.
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemv_fused.h"
#include "kernels/cuda/gemv_reduce.cuh"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pointwise_math.cuh"

namespace kiln::cuda {

// An epilogue's optional prefetch (E::prefetch(lo0)) of what its finish will read, issued by the
// GEMVs before their main loop (before their PDL wait) so it lands in L2 under the stream: an L2
// prefetch returns no data, so it may name memory the kernel before is still writing (pdl.cuh).
// Epilogues without one cost the kernels nothing (the callers test kEpiPrefetches at compile time).
template <class E>
constexpr bool kEpiPrefetches = requires(const E& e, int64_t lo0) { e.prefetch(lo0); };

// Whether a GEMV releases the kernel after it right after its own PDL wait (pdl.cuh; every epilogue
// but an AddNormRows told otherwise) or only as its blocks exit.
template <class E>
__device__ __forceinline__ bool epi_releases_early(const E& e) {
  if constexpr (requires { e.release_early; })
    return e.release_early;
  else
    return true;
}

// The W warps' partials of output row r, activation row m, added to `init` in warp order (the one
// order every epilogue uses, so fused and plain forms agree where they should).
template <int WA, int NT>
__device__ __forceinline__ float warps_sum(const float (&red)[WA][16][8 * NT + 1], int warps, int r, int m,
                                           float init) {
  float v = init;
#pragma unroll
  for (int q = 0; q < WA; ++q)
    if (q < warps) v += red[q][r][m];
  return v;
}

// The plain epilogue: tile b is rows 16b .. 16b + 15 (clamped loads past N, masked stores);
// y = acc (+ bias) per OutMode.
struct StoreRows {
  const bf16* bias;
  void* y;
  OutMode mode;
  __device__ __forceinline__ void rows(int64_t b, int64_t& lo0, int64_t& hi0) const {
    lo0 = 16 * b;
    hi0 = lo0 + 8;
  }
  template <int WA, int NT>
  __device__ __forceinline__ void finish(const float (&red)[WA][16][8 * NT + 1], int warps, int64_t lo0, int64_t,
                                         int m_actual, int64_t N) const {
    gemv_meet<WA, NT>(
        red, lo0, m_actual, N, [&](int64_t n) { return bias ? __bfloat162float(bias[n]) : 0.0f; },
        [&](int m, int64_t n, float v) { store_out(y, mode, int64_t(m) * N + n, v); }, warps);
  }
};

// The pairing epilogues run on warp 0 only: with M = 1 and one n-tile, lane l holds output row
// r = l % 16 of the tile (activation row l / 16: only lanes 0..15 are real), so the partner of
// row r in the other run of 8 is lane l ^ 8, an interleaved neighbour lane l ^ 1. The sum over the
// W warps is gemv_meet's (bias first, then warps in order), so the values match the plain GEMV.
template <int WA, int NT>
__device__ __forceinline__ float warp0_result(const float (&red)[WA][16][8 * NT + 1], int warps, int r, int m,
                                              float start) {
  return warps_sum<WA, NT>(red, warps, r, m, start);
}

// NormApply's s for activation row 0 (the fused GEMVs take M = 1), on every lane of warp 0: the
// K / 16 tile partials summed lane-strided, then a butterfly (every lane ends with the same bits).
// __ldcg: the partials were written by the kernel before this one, which may still have been
// running when this one started (PDL): read at L2, never a stale L1 line.
__device__ __forceinline__ float norm_scale(const NormApply& norm, int lane, int k) {
  float a = 0.0f;
  for (int i = lane; i < norm.tiles; i += 32) a += __ldcg(norm.sumsq + i);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  return rsqrtf(a / float(k) + norm.eps);
}

// warp0_result, or with a NormApply start + s * (the warps' partials summed in order): the bias is
// added after the scale, as it is after the norm kernel's GEMV.
template <int WA, int NT>
__device__ __forceinline__ float warp0_value(const float (&red)[WA][16][8 * NT + 1], int warps, int r, int m,
                                             float start, const NormApply& norm, int lane) {
  if (!norm.sumsq) return warp0_result<WA, NT>(red, warps, r, m, start);
  return start + norm_scale(norm, lane, 16 * norm.tiles) * warps_sum<WA, NT>(red, warps, r, m, 0.0f);
}

// qkv: q and k heads' rotated runs paired (i, i + rot_dim / 2) for the rotate-half layout; every
// other run (interleaved RoPE, the unrotated tail of a head, v) is 16 consecutive rows.
// kQuantCache (RopeKvQuantEpi): K/V into an int8 / fp8 cache through RopeKvTarget::q8; a separate
// instantiation, so the bf16-cache kernels keep their code and registers (the quantized write in
// the same kernels made the int8 / int4 qkv GEMVs spill).
template <bool kQuantCache>
struct RopeKvEpiT {
  const bf16* bias;
  RopeKvTarget o;
  NormApply norm = {};  // x is a NormProduce's z: scale the products by its s

  __device__ __forceinline__ void rows(int64_t b, int64_t& lo0, int64_t& hi0) const {
    const int64_t v0 = 16 * b, hd = o.head_dim;
    lo0 = v0;
    hi0 = v0 + 8;
    if (o.interleaved || v0 >= int64_t(o.n_heads + o.n_kv_heads) * hd) return;
    const int64_t h = v0 / hd, u0 = v0 - h * hd;
    if (u0 >= o.rot_dim) return;
    lo0 = h * hd + u0 / 2;  // run u0 / 16 of the first half
    hi0 = lo0 + o.rot_dim / 2;
  }

  template <int WA, int NT>
  __device__ __forceinline__ void finish(const float (&red)[WA][16][8 * NT + 1], int warps, int64_t lo0, int64_t hi0,
                                         int m_actual, int64_t) const {
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = int(threadIdx.x), r = lane % 16, m = lane / 16;
    const int64_t n = r < 8 ? lo0 + r : hi0 + r - 8;
    // The unfused path stores the projection as bf16 and RoPE reads that back.
    const float start = bias ? __bfloat162float(bias[n]) : 0.0f;
    emit(n, round_bf16(warp0_value<WA, NT>(red, warps, r, m, start, norm, lane)), m < m_actual);
  }

  // Every lane of one warp, lane l holding row r = l % 16 of a tile (n: its row of the projection)
  // with its final value v (bias and norm scale applied, bf16-rounded): RoPE with the partner row's
  // value (one shuffle), then the store into q or the cache. store = false: the lane only feeds the
  // shuffles. (Also the decode megakernel's qkv epilogue.)
  __device__ __forceinline__ void emit(int64_t n, float v, bool store) const {
    const float half_partner = __shfl_xor_sync(0xffffffffu, v, 8), pair_partner = __shfl_xor_sync(0xffffffffu, v, 1);
    // A quantized cache (KvQuantStage): every lane of the warp takes part (its shuffles and the
    // head's last-block hand-off).
    if constexpr (kQuantCache) {
      emit_quantized(n, rotated(n, v, half_partner, pair_partner), store);
      return;
    }
    if (!store) return;
    const int64_t pos = o.position[0], hd = o.head_dim;
    const int64_t qk_rows = int64_t(o.n_heads + o.n_kv_heads) * hd;
    auto kv_at = [&](int64_t kvh) {  // the element offset of kv head kvh's vector of this token
      return o.slot ? o.kv.slot_offset(o.slot[0], int(kvh)) : o.kv.offset_as<false>(0, pos, int(kvh));
    };
    if (n >= qk_rows) {  // v: into the cache as is
      const int64_t j = n - qk_rows, kvh = j / hd;
      o.kv.v[kv_at(kvh) + (j - kvh * hd)] = __float2bfloat16(v);
      return;
    }
    const int64_t h = n / hd, u = n - h * hd;
    const float out = rotated(n, v, half_partner, pair_partner);
    if (h < o.n_heads)
      o.q_out[n] = __float2bfloat16(out);
    else
      o.kv.k[kv_at(h - o.n_heads) + u] = __float2bfloat16(out);
  }

  // Row n's value after RoPE (q / k rows in the rotated part), fp32; v and unrotated rows as they are.
  __device__ __forceinline__ float rotated(int64_t n, float v, float half_partner, float pair_partner) const {
    const int64_t hd = o.head_dim, h = n / hd, u = n - h * hd;
    if (h >= o.n_heads + o.n_kv_heads || u >= o.rot_dim) return v;
    const int half = o.rot_dim / 2;
    const bool first = o.interleaved ? (u & 1) == 0 : u < half;  // a (x0) or b (x1) of the pair
    const int i = o.interleaved ? int(u >> 1) : first ? int(u) : int(u) - half;
    const float partner = o.interleaved ? pair_partner : half_partner;
    float s, c;
    rope_sincos_cached(o.cos_sin, o.cos_sin_positions, half, o.position[0], i, o.inv_freq, s, c);
    return first ? rope_a(v, partner, s, c) : rope_b(partner, v, s, c);
  }

  // The quantized cache's write (KvQuantStage): q rows as bf16; a K or V tile stages its 16 values,
  // raises the head's amax and counts itself in; the head's last tile encodes the head_dim values
  // with rope_qkv_quant's scale_of / encode (amax over |value| with NaN ignored, as fmaxf does there),
  // so the bytes and the scale are the unfused kernels' bits.
  __device__ __forceinline__ void emit_quantized(int64_t n, float out, bool store) const {
    const int64_t hd = o.head_dim, q_rows = int64_t(o.n_heads) * hd, kv_dim = int64_t(o.n_kv_heads) * hd;
    if (n < q_rows) {
      if (store) o.q_out[n] = __float2bfloat16(out);
      return;
    }
    const bool is_v = n >= q_rows + kv_dim;
    const int64_t j = n - q_rows - (is_v ? kv_dim : 0);  // the element within K (or V) of this token
    const int kvh = int(j / hd), head = (is_v ? o.n_kv_heads : 0) + kvh;
    float* stage = o.q8.values + (is_v ? kv_dim : 0);
    const float tile_amax = kvq::group_max(store ? fmaxf(0.0f, fabsf(out)) : 0.0f, 32);
    if (store) {
      __stcg(stage + j, out);
      __threadfence();  // the staged value before this tile's count
    }
    __syncwarp();
    const int lane = int(threadIdx.x % 32), tiles = int(hd / 16);
    uint32_t* amax_bits = o.q8.sync + head;
    uint32_t* count = o.q8.sync + 2 * o.n_kv_heads + head;
    uint32_t last = 0;
    if (lane == 0) {
      atomicMax(amax_bits, __float_as_uint(tile_amax));  // non-negative floats order as their bits
      __threadfence();
      last = atomicAdd(count, 1u) == uint32_t(tiles - 1);
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    __threadfence();  // the other tiles' values and amax, seen through L2 below
    const float amax = __uint_as_float(__ldcg(amax_bits));
    const int64_t si =
        o.slot ? o.kv.slot_quant_index(o.slot[0], kvh) : o.kv.quant_index_as<false>(0, o.position[0], kvh);
    if (o.kv.quant == KvQuant::int8)
      encode_head<KvQuant::int8>(stage + int64_t(kvh) * hd, amax, is_v, si, lane);
    else
      encode_head<KvQuant::fp8>(stage + int64_t(kvh) * hd, amax, is_v, si, lane);
    __syncwarp();
    if (lane == 0) {  // for the next launch (the next layer, a graph replay)
      *amax_bits = 0u;
      *count = 0u;
    }
  }

  template <KvQuant F>
  __device__ __forceinline__ void encode_head(const float* staged, float amax, bool is_v, int64_t si, int lane) const {
    float scale, inv;
    kvq::scale_of<F>(amax, scale, inv);
    uint8_t* dst = (is_v ? o.kv.v8 : o.kv.k8) + si * o.head_dim;
    for (int e = lane; e < o.head_dim; e += 32) dst[e] = kvq::encode<F>(__ldcg(staged + e), inv);
    if (lane == 0) (is_v ? o.kv.v_scale : o.kv.k_scale)[si] = scale;
  }
};

using RopeKvEpi = RopeKvEpiT<false>;
using RopeKvQuantEpi = RopeKvEpiT<true>;

// gate/up: tile b multiplies gate rows 8b .. 8b + 7 and up rows inter + 8b .. + 7.
struct SwiGluEpi {
  bf16* h;
  int64_t inter;
  NormApply norm = {};  // as RopeKvEpi's

  __device__ __forceinline__ void rows(int64_t b, int64_t& lo0, int64_t& hi0) const {
    lo0 = 8 * b;
    hi0 = inter + 8 * b;
  }

  template <int WA, int NT>
  __device__ __forceinline__ void finish(const float (&red)[WA][16][8 * NT + 1], int warps, int64_t lo0, int64_t,
                                         int m_actual, int64_t) const {
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = int(threadIdx.x), r = lane % 16, m = lane / 16;
    emit(lo0, r, round_bf16(warp0_value<WA, NT>(red, warps, r, m, 0.0f, norm, lane)), m < m_actual);
  }

  // Every lane of one warp, lane l holding row r = l % 16 of the tile whose gate rows start at lo0,
  // with its final value v (gate for r < 8, up else): h = silu(gate) * up from the partner's value
  // (one shuffle). store = false: the lane only feeds the shuffle. (Also the decode megakernel's.)
  __device__ __forceinline__ void emit(int64_t lo0, int r, float v, bool store) const {
    const float up = __shfl_xor_sync(0xffffffffu, v, 8);
    if (!store || r >= 8) return;
    h[lo0 + r] = __float2bfloat16(silu_mul_value(v, up));
  }
};

// o and down with the first half of the next RMSNorm (NormProduce, gemv_fused.h): tile b is rows
// 16b .. 16b + 15 as StoreRows; y += the product with StoreRows' sum and add (add_f32: the residual
// gets the plain GEMV's bits), then z = bf16(y o weight) and the tile's sum of y^2, summed over its
// 16 rows by a fixed shuffle tree. Needs N % 16 == 0 (whole tiles). Its loop is gemv_meet's without
// the early `continue` (the shuffles need every lane of a warp).
struct AddNormRows {
  float* y;
  NormProduce o;
  // false: the kernel leaves the next kernel's launch to its blocks' exits instead of releasing it
  // after its wait (gemv_fused.h's NextLaunch).
  bool release_early = true;
  __device__ __forceinline__ void rows(int64_t b, int64_t& lo0, int64_t& hi0) const {
    lo0 = 16 * b;
    hi0 = lo0 + 8;
  }
  // The tile's 16 norm weights (32 bytes) and M = 1 residual values (64 bytes, 64-byte aligned: one
  // line each) into L2 before the main loop: without it the epilogue's loads went to DRAM after the
  // stream (o + norm measured 3 us a call slower than o, H200 session 12 run 1). L2 is the point of
  // coherence, so the residual's line may be fetched while its writer still runs (PDL): the
  // epilogue's own load comes after the wait.
  __device__ __forceinline__ void prefetch(int64_t lo0) const {
    if (threadIdx.x == 0) {
      prefetch_l2(o.weight + lo0);
      prefetch_l2(y + lo0);
    }
  }
  template <int WA, int NT>
  __device__ __forceinline__ void finish(const float (&red)[WA][16][8 * NT + 1], int warps, int64_t lo0, int64_t,
                                         int m_actual, int64_t N) const {
    __syncthreads();
    // Item i = (row r = i % 16, activation row m = i / 16): the 16 rows of one m are 16 neighbouring
    // lanes, and every lane of a warp runs the same number of iterations (16 * 8 * NT and the
    // stride are multiples of 32), so the shuffles below see whole warps.
    for (int i = threadIdx.x; i < 16 * 8 * NT; i += warps * 32) {
      const int r = i % 16, m = i / 16;
      const int64_t n = lo0 + r;
      float sq = 0.0f;
      if (m < m_actual && n < N) {
        float* p = y + int64_t(m) * N + n;
        const float y0 = *p, wn = __bfloat162float(o.weight[n]);  // both loads before any store
        const float x = y0 + warps_sum<WA, NT>(red, warps, r, m, 0.0f);
        *p = x;
        o.z[int64_t(m) * N + n] = __float2bfloat16(x * wn);
        sq = x * x;
      }
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
      if (r == 0 && m < m_actual) o.sumsq[int64_t(m) * (N / 16) + lo0 / 16] = sq;
    }
  }
};

}  // namespace kiln::cuda
