// Flash-decoding over the quantized KV cache (kv_layout.h's quantized form, kv_quant.h): the 8-bit
// K/V tiles are what crosses HBM, half the bytes of the bf16 cache.
//
// The shape of attention_decode.cu's tensor-core kernel (grid (P, KV head x head group, sequence),
// 4 warps, 64-position tiles taken interleaved by the P split blocks, PDL launch with the older
// tiles loaded before griddepcontrol.wait, a combine kernel for sequences split over blocks), with
// these differences:
//  * Each warp owns 16 rows (keys) of every tile: it scores only those keys and its P.V product
//    only reads those V rows, so a warp loads, converts and consumes its own rows and the tile loop
//    needs no block barrier, only __syncwarp. A lane converts exactly the 16-byte chunks it copied.
//  * The cp.async pipeline moves bytes: per warp and stage 16 rows of K and of V (head_dim bytes
//    each) and their 32 scales (4-byte copies); 4 stages (2 x 64 x 128 bytes x 4 = 64 KB in flight
//    per block at head_dim 128, against the bf16 kernel's 3 stages of 32 KB).
//  * The bytes become bf16 without their scale (kvq::bytes_to_bf16x2: exact for int8 and e4m3,
//    integer and bf16x2 operations only): V into a per-warp swizzled bf16 tile for ldmatrix.trans,
//    K straight into the mma B fragments (version 2, the default) or also through a bf16 tile
//    (version 1). The scales are applied in fp32 per key (attention_q8_tile.cuh).
//  * Versions: 1 = bf16 K tile, 4 stages; 2 = K in registers, 5 stages in the same shared memory
//    (2 blocks per SM either way); 3 = K in registers, 3 stages, 3 blocks per SM (more warps, fewer
//    tiles in flight each). The kernel lab times all three; KILN_ATTN_Q8=1|3 makes 1 or 3 the
//    default where it is built (head_dim 128, contiguous, int8), for end-to-end comparisons.
// Numerics against the CPU reference (fake-quantized K/V in fp32): the same bytes and scales; the
// scores are q . (byte * scale) there and scale * (q . byte) here, and P * v_scale is rounded to
// bf16 where the bf16 kernel rounds P and v -- errors of the bf16 kernel's size.
// Measured (H200, kernel lab, 32/8 heads, d 128, same run as the bf16 kernel; GB/s on the bytes
// read): b=1 L=32k int8 43.5 us (1.59 TB/s; bf16 43.9 us), fp8 40.4 us; b=64 L=2k int8 128.0 us
// (2.16 TB/s; bf16 132.3 us), fp8 116.5 us. Half the bytes, about the bf16 kernel's time: the
// kernel runs at the same number of tiles per second as the bf16 one, whatever the bytes (the
// layout of the bytes, position- or head-major, changed nothing); docs/PERFORMANCE.md, session 5.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_decode_combine.h"
#include "kernels/cuda/attention_decode_slices.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_q8_tile.cuh"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

using attn::kTileKv;
using attn_q8::kWarpKeys;  // 4 warps x 16 keys = one 64-position tile
constexpr int kThreads = 128, kRows = 16;
constexpr int kDefaultVersion = 2;
constexpr int stages_of(int version) { return version == 1 ? 4 : version == 2 ? 5 : 3; }

// The 64-position tiles of split block `split` of P (interleaved: tiles split, split + P, ...), as
// attention_decode.cu's default; used = blocks that hold data.
struct Split {
  int n_tiles, pos0, step, end, used;
};
__device__ __forceinline__ Split q8_split(int len, int P, int split) {
  const int T = (len + kTileKv - 1) / kTileKv;
  return Split{split < T ? (T - split + P - 1) / P : 0, split * kTileKv, P * kTileKv, len, min(P, T)};
}

// Shared memory: q (16, D) bf16, then per warp stages x [K bytes (16, D) | V bytes (16, D) | 16 K
// scales | 16 V scales] and the converted bf16 tiles (16, D): V, and K in version 1.
template <int D, int kV>
struct Q8Smem {
  static constexpr int kStages = stages_of(kV);
  static constexpr int kRaw = 2 * kWarpKeys * D + 2 * kWarpKeys * 4;
  static constexpr int kWarp = kStages * kRaw + (kV == 1 ? 2 : 1) * kWarpKeys * D * 2;
  static constexpr size_t kBytes = size_t(kRows) * D * 2 + 4 * size_t(kWarp);
  static_assert(kRaw % 16 == 0 && kWarp % 16 == 0);
};

template <int D, bool kPaged, KvQuant F, int kV>
__global__ void __launch_bounds__(kThreads, kV == 3 ? 3 : 2)
    decode_q8_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len, DecodeWorkspace ws,
                     bf16* __restrict__ out, int n_heads, int group, int head_groups, int d, int ws_splits,
                     float scale_log2) {
  using namespace attn;
  using namespace attn_q8;
  using Smem = Q8Smem<D, kV>;
  constexpr int kStages = Smem::kStages;
  constexpr int kCh = D / 16, kPer = kWarpKeys * kCh / 32;  // 16-byte chunks of a row; per lane per tile
  extern __shared__ uint4 smem_raw[];
  bf16* const qs = reinterpret_cast<bf16*>(smem_raw);
  const int split = blockIdx.x, b = blockIdx.z;
  const int kvh = blockIdx.y / head_groups, hg = blockIdx.y % head_groups;
  const int h0 = kvh * group + hg * kRows, nh = min(kRows, group - hg * kRows);
  // PDL as in attention_decode.cu: before pdl_wait only kv_len and older K/V tiles are read.
  const int len = kv_len[b];
  const Split sp = q8_split(len, int(gridDim.x), split);
  if (sp.n_tiles <= 0) {
    if (gridDim.x == 1) pdl_wait();  // no combine follows at P = 1 (attention_decode.cu's split kernel)
    return;
  }
  const bool single = sp.used <= 1;
  const int n_tiles = sp.n_tiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  char* const wbase = reinterpret_cast<char*>(smem_raw) + kRows * D * 2 + warp * Smem::kWarp;
  auto raw_k = [&](int st) { return reinterpret_cast<uint8_t*>(wbase + st * Smem::kRaw); };
  auto raw_v = [&](int st) { return raw_k(st) + kWarpKeys * D; };
  auto raw_s = [&](int st) { return reinterpret_cast<float*>(raw_k(st) + 2 * kWarpKeys * D); };
  bf16* const cv = reinterpret_cast<bf16*>(wbase + kStages * Smem::kRaw);
  [[maybe_unused]] bf16* const ck = cv + kWarpKeys * D;  // version 1 only

  auto tile_pos = [&](int tile) { return sp.pos0 + tile * sp.step; };
  auto fresh = [&](int tile) { return tile_pos(tile) + min(kTileKv, sp.end - tile_pos(tile)) >= len; };
  auto warp_pos = [&](int tile) { return tile_pos(tile) + warp * kWarpKeys; };  // this warp's first row
  auto warp_keys = [&](int tile) { return max(0, min(kWarpKeys, sp.end - warp_pos(tile))); };

  // Paged: block ids of this lane's rows of the next tile to load (its data rows, then its scale
  // row), fetched one tile ahead so the lookups overlap a tile's compute.
  [[maybe_unused]] int32_t blk[kPer + 1] = {};
  auto fetch = [&](int tile) {
    if constexpr (kPaged) {
      if (tile >= n_tiles) return;
      const int p0 = warp_pos(tile), n = warp_keys(tile);
      const int32_t* bt = kv.block_table + int64_t(b) * kv.bt_stride;
#pragma unroll
      for (int it = 0; it <= kPer; ++it) {
        const int r = it < kPer ? (it * 32 + lane) / kCh : lane & 15;
        blk[it] = r < n ? __ldg(bt + ((p0 + r) >> kv.block_shift)) : 0;
      }
    }
  };
  auto slot_of = [&](int it, int pos) {
    return (int64_t(blk[it]) << kv.block_shift) | (pos & ((1 << kv.block_shift) - 1));
  };
  auto load = [&](int tile, int st) {
    const int p0 = warp_pos(tile), n = warp_keys(tile);
#pragma unroll
    for (int it = 0; it < kPer; ++it) {
      const int i = it * 32 + lane, r = i / kCh, c = i % kCh;
      const bool ok = r < n && c * 16 < d;
      int64_t off;  // head-major (kv_layout.h): this warp's 16 rows are one run (paged: runs of a block)
      if constexpr (kPaged)
        off = kv.slot_quant_index(slot_of(it, p0 + r), kvh) * kv.head_dim;
      else
        off = kv.quant_index_as<false>(b, p0 + r, kvh) * kv.head_dim;
      cp_async16(raw_k(st) + (r * kCh + kchunk<D, kV == 1 ? 1 : 2>(r, c)) * 16, ok ? kv.k8 + off + c * 16 : kv.k8, ok);
      cp_async16(raw_v(st) + i * 16, ok ? kv.v8 + off + c * 16 : kv.v8, ok);
    }
    const int r = lane & 15;
    int64_t si;
    if constexpr (kPaged)
      si = kv.slot_quant_index(slot_of(kPer, p0 + r), kvh);
    else
      si = kv.quant_index_as<false>(b, p0 + r, kvh);
    const float* src = lane < 16 ? kv.k_scale : kv.v_scale;
    cp_async4(raw_s(st) + lane, r < n ? src + si : src, r < n);
  };

  // The first kStages - 1 tiles, one cp.async group each: the older ones now, ...
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles && !fresh(st)) {
      fetch(st);
      load(st, st);
    }
    cp_async_commit();
  }
  pdl_wait();
  pdl_launch_dependents();
  // ... then q and a fresh tile among them, as one more group.
  const bf16* qb = q + (int64_t(b) * n_heads + h0) * d;
  load_tile_async<D, kRows, kThreads>(qs, nh, d, [&](int r) { return qb + r * d; }, q);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles && fresh(st)) {
      fetch(st);
      load(st, st);
    }
  }
  cp_async_commit();
  fetch(kStages - 1);
  cp_async_wait<0>();
  __syncthreads();  // q is shared by the 4 warps
  uint32_t qf[D / 16][4];
  if constexpr (kV == 1)
    load_q_frags<D>(qf, qs, 0);
  else
    load_q_frags_perm<D>(qf, qs);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncwarp();  // every lane's copies of this tile landed; the bf16 tiles and stage tile - 1 are free
    if (tile + kStages - 1 < n_tiles) {
      load(tile + kStages - 1, (tile + kStages - 1) % kStages);
      fetch(tile + kStages);
    }
    cp_async_commit();
    const int st = tile % kStages, n = warp_keys(tile);
    if (n <= 0) continue;
    if constexpr (kV == 1) convert_rows<D, F>(raw_k(st), ck);
    convert_rows<D, F>(raw_v(st), cv);
    __syncwarp();
    const float *sk = raw_s(st), *sv = sk + kWarpKeys;
    if constexpr (kV == 1) {
      if (n >= kWarpKeys)
        attend_q8<D, false>(qf, ck, cv, sk, sv, n, m, l, o, scale_log2);
      else
        attend_q8<D, true>(qf, ck, cv, sk, sv, n, m, l, o, scale_log2);
    } else {
      if (n >= kWarpKeys)
        attend_q8_kreg<D, F, false>(qf, raw_k(st), cv, sk, sv, n, m, l, o, scale_log2);
      else
        attend_q8_kreg<D, F, true>(qf, raw_k(st), cv, sk, sv, n, m, l, o, scale_log2);
    }
  }

  // Merge the 4 warps through shared memory (reusing the warp areas), as attention_decode.cu.
  cp_async_wait<0>();
  __syncthreads();
  float* const ms = reinterpret_cast<float*>(reinterpret_cast<char*>(smem_raw) + kRows * D * 2);  // (4, 16)
  float* const ls = ms + 4 * kRows;                                                               // (4, 16)
  float* const os = ls + 4 * kRows;                                                               // (4, 16, D)
  static_assert((8 * kRows + 4 * kRows * D) * sizeof(float) <= 4 * size_t(Smem::kWarp));
  store_warp_state<D>(ms, ls, os, kRows, m, l, o, scale_log2);
  __syncthreads();
  for (int i = threadIdx.x; i < nh * d; i += kThreads) {
    const int r = i / d, c = i % d;
    const auto [mx, num, den] = merge_warps<D>(ms, ls, os, kRows, r, c);
    const int64_t head_row = int64_t(b) * n_heads + h0 + r;
    if (single) {
      out[head_row * d + c] = __float2bfloat16(num / den);
    } else {
      const int64_t wrow = head_row * ws_splits + split;
      ws.partial_o[wrow * d + c] = num;
      if (c == 0) {
        ws.partial_ml[wrow * 2] = mx;
        ws.partial_ml[wrow * 2 + 1] = den;
      }
    }
  }
}

template <int D, bool kPaged, KvQuant F, int kV>
void launch_q8(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out, DecodeWorkspace ws,
               int64_t batch, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  static std::once_flag configured;
  static int resident_blocks = 0;
  static bool pdl_ok = false;
  constexpr auto kernel = decode_q8_kernel<D, kPaged, F, kV>;
  constexpr size_t smem = Q8Smem<D, kV>::kBytes;
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    resident_blocks = std::max(1, device_sm_count() * std::max(1, per_sm));
    pdl_ok = device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
  });
  const int group = n_heads / n_kv_heads, head_groups = (group + kRows - 1) / kRows;
  const int ws_splits = int(decode_max_splits(max_kv_len));
  // One wave of resident blocks at lengths near the capacity (attention_decode.cu's default).
  const int P = decode_split_count(resident_blocks, 1, batch * n_kv_heads * head_groups, ws_splits);
  const dim3 grid(unsigned(P), unsigned(n_kv_heads * head_groups), unsigned(batch));
  static const bool split_pdl_env = env_switch_on("KILN_ATTN_SPLIT_PDL");  // as attention_decode.cu
  const float scale_log2 = attn::kLog2e / sqrtf(float(head_dim));
  launch_maybe_pdl(pdl_ok && split_pdl_env, kernel, grid, dim3(kThreads), smem, stream, q, kv, kv_len, ws, out,
                   n_heads, group, head_groups, head_dim, ws_splits, scale_log2);
  KILN_CUDA_CHECK_LAUNCH();
  // attention_decode.cu's combine: this kernel's splits are its interleaved ones (q8_split).
  launch_decode_combine(ws, kv_len, out, batch, n_heads, head_dim, ws_splits, P, true, pdl_ok, stream);
}

template <int D, bool kPaged>
void launch_q8_format(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                      DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                      cudaStream_t stream) {
  if (kv.quant == KvQuant::int8)
    launch_q8<D, kPaged, KvQuant::int8, kDefaultVersion>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                                         head_dim, stream);
  else
    launch_q8<D, kPaged, KvQuant::fp8, kDefaultVersion>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                                        head_dim, stream);
}

}  // namespace

void attention_decode_q8(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                         DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                         cudaStream_t stream) {
  attention_decode_q8_version(0, q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
}

bool attention_decode_q8_version(int version, const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len,
                                 bf16* out, DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads,
                                 int head_dim, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(kv.quantized() && kv_quant_supported(head_dim) && kv.head_dim == head_dim,
                    "attention_decode_q8: needs a quantized KV layout and head_dim % 16 == 0, <= 128");
  KILN_CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  KILN_CUDA_REQUIRE(attn::aligned16(q) && attn::aligned16(out) && attn::aligned16(kv.k8) && attn::aligned16(kv.v8) &&
                        kv.head_dim % 16 == 0,
                    "attention_decode_q8: q, out and the K/V bytes must be 16-byte aligned");
  KILN_CUDA_REQUIRE(batch < 65536, "attention: batch too large");
  static const int env_version = [] {
    const int v = env_int("KILN_ATTN_Q8", 0);
    return v == 1 || v == 3 ? v : 0;
  }();
  const bool asked = version != 0;
  if (!asked) version = env_version;
  if (version == 1 || version == 3) {  // the comparisons: head_dim 128, contiguous, int8 only
    const bool ok = head_dim > 64 && !kv.paged() && kv.quant == KvQuant::int8;
    if (!ok && asked) return false;
    if (ok) {
      if (batch > 0 && version == 1)
        launch_q8<128, false, KvQuant::int8, 1>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                                head_dim, stream);
      if (batch > 0 && version == 3)
        launch_q8<128, false, KvQuant::int8, 3>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads,
                                                head_dim, stream);
      return true;
    }
  }
  const bool slice_version = version >= 4 && version <= 6;  // 5, 6: the slice kernel's variants 1, 2
  if (batch == 0) return true;
  KILN_CUDA_REQUIRE(max_kv_len < (int64_t(1) << 31), "attention: max_kv_len too large");
  KILN_CUDA_REQUIRE(!kv.paged() || (kv.block_shift >= 0 && kv.block_shift <= 20 && kv.bt_stride > 0),
                    "attention: bad paged KV layout (block_size must be a power of two)");
  // Many sequences: the slice kernel (attention_decode_q8_slices.cu), by the bf16 kernel's rule
  // (attention_decode.cu); version 4 forces it at any batch (the lab's and the tests' measure).
  // KILN_ATTN_Q8_SLICES: 0 off, 1 fp8 caches only, 2 (default) int8 caches too. int8 waited for
  // session 26's device run of its fixed byte -> f16 conversion (session 23 had found a wrong PRMT
  // selector): its tests passed and the 2048 x 128/128 run went from 17.2k to 18.7k output tok/s.
  static const int slices_mode = env_int("KILN_ATTN_Q8_SLICES", 2);
  const bool slices_default = slices_mode == 2 || (slices_mode == 1 && kv.quant == KvQuant::fp8);
  if (slice_version || (version == 0 && slices_default)) {
    const int variant = slice_version ? version - 4 : 0;
    const DecodeSlicesFit fit = decode_q8_slices_fit(kv.quant, n_heads, n_kv_heads, head_dim, kv.paged(), variant);
    const bool fits = fit.blocks_per_sm >= 2;
    if (slice_version && !fits) return false;
    if (fits && (slice_version || 8 * batch * n_kv_heads >= kDecodeSlicesPairsPer8Warps * fit.resident_warps)) {
      static const bool pdl = env_switch_on("KILN_ATTN_SPLIT_PDL");  // as the split kernels (launch_maybe_pdl: sm_90+)
      attention_decode_q8_slices(q, kv, kv_len, out, batch, n_heads, n_kv_heads, head_dim, pdl, stream, variant);
      return true;
    }
  }
  if (kv.paged()) {
    if (head_dim <= 64)
      launch_q8_format<64, true>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
    else
      launch_q8_format<128, true>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
  } else {
    if (head_dim <= 64)
      launch_q8_format<64, false>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
    else
      launch_q8_format<128, false>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
  }
  return true;
}

}  // namespace kiln::cuda
