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
//    integer and bf16x2 operations only) in a per-warp swizzled bf16 tile, read by the same ldmatrix
//    / mma.sync code as the bf16 kernel. The scales are applied in fp32 where they are per key: each
//    score column is multiplied by its key's K scale, and each probability by its key's V scale
//    before it is rounded to bf16 for P.V (the softmax sum uses the unscaled probability).
// Numerics against the CPU reference (fake-quantized K/V in fp32): the same bytes and scales; the
// scores are q . (byte * scale) there and scale * (q . byte) here, and P * v_scale is rounded to
// bf16 where the bf16 kernel rounds P and v -- errors of the bf16 kernel's size.
// Measured: docs/PERFORMANCE.md (session 5, quantized KV cache).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

using attn::kTileKv;
constexpr int kThreads = 128, kRows = 16, kWarpKeys = 16;  // 4 warps x 16 keys = one 64-position tile
constexpr int kStages = 4;

__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(attn::smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

// The 64-position tiles of split block `split` of P (interleaved: tiles split, split + P, ...), as
// attention_decode.cu's default; used = blocks that hold data.
struct Split {
  int n_tiles, pos0, step, end, used;
};
__device__ __forceinline__ Split q8_split(int len, int P, int split) {
  const int T = (len + kTileKv - 1) / kTileKv;
  return Split{split < T ? (T - split + P - 1) / P : 0, split * kTileKv, P * kTileKv, len, min(P, T)};
}

// Shared memory: q (16, D) bf16, then per warp kStages x [K bytes (16, D) | V bytes (16, D) | 16 K
// scales | 16 V scales] and the converted bf16 K and V tiles (16, D) each.
template <int D>
struct Q8Smem {
  static constexpr int kRaw = 2 * kWarpKeys * D + 2 * kWarpKeys * 4;
  static constexpr int kWarp = kStages * kRaw + 2 * kWarpKeys * D * 2;
  static constexpr size_t kBytes = size_t(kRows) * D * 2 + 4 * size_t(kWarp);
  static_assert(kRaw % 16 == 0 && kWarp % 16 == 0);
};

// One warp: 16 query rows against its 16 keys (n_keys of them real), online softmax; sk / sv: the
// keys' scales. attention_mma.h's attend_tile with the scales applied (see the file comment).
template <int D, bool kMask>
__device__ __forceinline__ void attend_q8(const uint32_t (&qf)[D / 16][4], const bf16* ks, const bf16* vs,
                                          const float* sk, const float* sv, int n_keys, float (&m)[2], float (&l)[2],
                                          float (&o)[D / 8][4], float scale_log2) {
  using namespace attn;
  const int lane = threadIdx.x % 32, t = lane & 3;
  float s[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  {
    const int key_in = (lane & 7) + ((lane >> 4) << 3), chunk_in = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, ks + swz<D>(key_in, kk * 2 + chunk_in));
      mma_bf16(s[0], qf[kk], b[0], b[1]);
      mma_bf16(s[1], qf[kk], b[2], b[3]);
    }
  }
  // s[j][e] is key 8 j + 2 t + (e & 1).
  float kscale[2][2], vscale[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float2 k2 = *reinterpret_cast<const float2*>(sk + 8 * j + 2 * t);
    const float2 v2 = *reinterpret_cast<const float2*>(sv + 8 * j + 2 * t);
    kscale[j][0] = k2.x, kscale[j][1] = k2.y, vscale[j][0] = v2.x, vscale[j][1] = v2.y;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] *= kscale[j][e & 1];
      if (kMask && 8 * j + 2 * t + (e & 1) >= n_keys) s[j][e] = -INFINITY;
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = m[i];
#pragma unroll
    for (int j = 0; j < 2; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;
    const float corr = exp2f(m[i] * scale_log2 - base);
    m[i] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][2 * i] = exp2f(fmaf(s[j][2 * i], scale_log2, -base));
      s[j][2 * i + 1] = exp2f(fmaf(s[j][2 * i + 1], scale_log2, -base));
      sum += s[j][2 * i] + s[j][2 * i + 1];
    }
    l[i] = l[i] * corr + sum;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][2 * i] *= corr, o[n][2 * i + 1] *= corr;
  }
  uint32_t a[4];
  a[0] = pack_bf16(s[0][0] * vscale[0][0], s[0][1] * vscale[0][1]);
  a[1] = pack_bf16(s[0][2] * vscale[0][0], s[0][3] * vscale[0][1]);
  a[2] = pack_bf16(s[1][0] * vscale[1][0], s[1][1] * vscale[1][1]);
  a[3] = pack_bf16(s[1][2] * vscale[1][0], s[1][3] * vscale[1][1]);
  const int key_in = (lane & 7) + (((lane >> 3) & 1) << 3), chunk_in = lane >> 4;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, vs + swz<D>(key_in, n * 2 + chunk_in));
    mma_bf16(o[2 * n], a, b[0], b[1]);
    mma_bf16(o[2 * n + 1], a, b[2], b[3]);
  }
}

// Bytes (a warp's 16 rows, row-major, D bytes a row) -> the swizzled bf16 tile: this lane's chunks.
template <int D, KvQuant F>
__device__ __forceinline__ void convert_rows(const uint8_t* raw, bf16* tile) {
  constexpr int kCh = D / 16, kPer = kWarpKeys * kCh / 32;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    const int i = it * 32 + lane, r = i / kCh, c = i % kCh;
    const uint4 w = *reinterpret_cast<const uint4*>(raw + i * 16);
    uint4 lo, hi;
    kvq::bytes_to_bf16x2<F>(w.x, lo.x, lo.y);
    kvq::bytes_to_bf16x2<F>(w.y, lo.z, lo.w);
    kvq::bytes_to_bf16x2<F>(w.z, hi.x, hi.y);
    kvq::bytes_to_bf16x2<F>(w.w, hi.z, hi.w);
    *reinterpret_cast<uint4*>(tile + attn::swz<D>(r, 2 * c)) = lo;
    *reinterpret_cast<uint4*>(tile + attn::swz<D>(r, 2 * c + 1)) = hi;
  }
}

template <int D, bool kPaged, KvQuant F>
__global__ void __launch_bounds__(kThreads, 2)
    decode_q8_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len, DecodeWorkspace ws,
                     bf16* __restrict__ out, int n_heads, int group, int head_groups, int d, int ws_splits,
                     float scale_log2) {
  using namespace attn;
  using Smem = Q8Smem<D>;
  constexpr int kCh = D / 16, kPer = kWarpKeys * kCh / 32;  // 16-byte chunks of a row; per lane per tile
  extern __shared__ uint4 smem_raw[];
  bf16* const qs = reinterpret_cast<bf16*>(smem_raw);
  const int split = blockIdx.x, b = blockIdx.z;
  const int kvh = blockIdx.y / head_groups, hg = blockIdx.y % head_groups;
  const int h0 = kvh * group + hg * kRows, nh = min(kRows, group - hg * kRows);
  // PDL as in attention_decode.cu: before pdl_wait only kv_len and older K/V tiles are read.
  const int len = kv_len[b];
  const Split sp = q8_split(len, int(gridDim.x), split);
  if (sp.n_tiles <= 0) return;
  const bool single = sp.used <= 1;
  const int n_tiles = sp.n_tiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  char* const wbase = reinterpret_cast<char*>(smem_raw) + kRows * D * 2 + warp * Smem::kWarp;
  auto raw_k = [&](int st) { return reinterpret_cast<uint8_t*>(wbase + st * Smem::kRaw); };
  auto raw_v = [&](int st) { return raw_k(st) + kWarpKeys * D; };
  auto raw_s = [&](int st) { return reinterpret_cast<float*>(raw_k(st) + 2 * kWarpKeys * D); };
  bf16* const ck = reinterpret_cast<bf16*>(wbase + kStages * Smem::kRaw);
  bf16* const cv = ck + kWarpKeys * D;

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
      cp_async16(raw_k(st) + i * 16, ok ? kv.k8 + off + c * 16 : kv.k8, ok);
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
  load_q_frags<D>(qf, qs, 0);
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
    convert_rows<D, F>(raw_k(st), ck);
    convert_rows<D, F>(raw_v(st), cv);
    __syncwarp();
    if (n >= kWarpKeys)
      attend_q8<D, false>(qf, ck, cv, raw_s(st), raw_s(st) + kWarpKeys, n, m, l, o, scale_log2);
    else
      attend_q8<D, true>(qf, ck, cv, raw_s(st), raw_s(st) + kWarpKeys, n, m, l, o, scale_log2);
  }

  // Merge the 4 warps through shared memory (reusing the warp areas), as attention_decode.cu.
  cp_async_wait<0>();
  __syncthreads();
  float* const ms = reinterpret_cast<float*>(reinterpret_cast<char*>(smem_raw) + kRows * D * 2);  // (4, 16)
  float* const ls = ms + 4 * kRows;                                                               // (4, 16)
  float* const os = ls + 4 * kRows;                                                               // (4, 16, D)
  static_assert((8 * kRows + 4 * kRows * D) * sizeof(float) <= 4 * size_t(Smem::kWarp));
  {
    const int t = lane & 3, g = lane >> 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float lsum = quad_sum(l[i]);
      const int r = g + 8 * i;
      if (t == 0) {
        ms[warp * kRows + r] = m[i] == -INFINITY ? -INFINITY : m[i] * scale_log2;
        ls[warp * kRows + r] = lsum;
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<float2*>(os + (warp * kRows + r) * D + n * 8 + 2 * t) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh * d; i += kThreads) {
    const int r = i / d, c = i % d;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) mx = fmaxf(mx, ms[w * kRows + r]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float e = exp2f(ms[w * kRows + r] - mx);
      num += e * os[(w * kRows + r) * D + c];
      den += e * ls[w * kRows + r];
    }
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

// attention_decode.cu's combine kernel (file-local there), for this kernel's splits: grid
// (n_heads, batch), 128 threads; merges the split blocks that hold data.
template <bool kMax>
__device__ __forceinline__ float block_reduce128(float v, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < 4; ++w) v = kMax ? fmaxf(v, red[w]) : v + red[w];
  __syncthreads();
  return v;
}

__global__ void __launch_bounds__(kAttnMaxHeadDim)
    decode_q8_combine_kernel(DecodeWorkspace ws, const int32_t* __restrict__ kv_len, bf16* __restrict__ out,
                             int n_heads, int d, int ws_splits, int P) {
  extern __shared__ float wts[];  // P weights
  __shared__ float red[kAttnMaxHeadDim / 32];
  const int h = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  const int n_used = q8_split(kv_len[b], P, 0).used;
  if (n_used <= 1) return;  // the split kernel wrote the output
  pdl_wait();
  const int64_t row = (int64_t(b) * n_heads + h) * ws_splits;
  const float2* ml = reinterpret_cast<const float2*>(ws.partial_ml) + row;
  float mx = -INFINITY;
  for (int s = c; s < n_used; s += kAttnMaxHeadDim) mx = fmaxf(mx, ml[s].x);
  mx = block_reduce128<true>(mx, red);
  float den = 0.0f;
  for (int s = c; s < n_used; s += kAttnMaxHeadDim) {
    const float2 v = ml[s];
    const float w = exp2f(v.x - mx);
    wts[s] = w;
    den += w * v.y;
  }
  den = block_reduce128<false>(den, red);
  if (c >= d) return;
  const float* po = ws.partial_o + row * d + c;
  float num = 0.0f;
  int s = 0;
  for (; s + 8 <= n_used; s += 8) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = po[int64_t(s + u) * d];
#pragma unroll
    for (int u = 0; u < 8; ++u) num = fmaf(wts[s + u], v[u], num);
  }
  for (; s < n_used; ++s) num = fmaf(wts[s], po[int64_t(s) * d], num);
  out[(int64_t(b) * n_heads + h) * d + c] = __float2bfloat16(num / den);
}

constexpr int kMaxCombineSplits = 4096;

template <int D, bool kPaged, KvQuant F>
void launch_q8(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out, DecodeWorkspace ws,
               int64_t batch, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  static std::once_flag configured;
  static int resident_blocks = 0;
  static bool pdl_ok = false;
  constexpr auto kernel = decode_q8_kernel<D, kPaged, F>;
  constexpr size_t smem = Q8Smem<D>::kBytes;
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int dev = 0, sms = 0, per_sm = 0, major = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    resident_blocks = std::max(1, sms * std::max(1, per_sm));
    pdl_ok = major >= 9;
  });
  const int group = n_heads / n_kv_heads, head_groups = (group + kRows - 1) / kRows;
  const int ws_splits = int(decode_max_splits(max_kv_len));
  // One wave of resident blocks at lengths near the capacity (attention_decode.cu's default).
  const int64_t pairs = batch * n_kv_heads * head_groups;
  const int P = int(std::clamp<int64_t>((resident_blocks + pairs - 1) / pairs, 1,
                                        std::clamp(ws_splits, 1, kMaxCombineSplits)));
  const dim3 grid(unsigned(P), unsigned(n_kv_heads * head_groups), unsigned(batch));
  static const bool split_pdl_env = [] {
    const char* e = std::getenv("KILN_ATTN_SPLIT_PDL");
    return !(e && std::string(e) == "0");
  }();
  const float scale_log2 = attn::kLog2e / sqrtf(float(head_dim));
  if (pdl_ok && pdl_enabled() && split_pdl_env) {
    launch_pdl(kernel, grid, dim3(kThreads), smem, stream, q, kv, kv_len, ws, out, n_heads, group, head_groups,
               head_dim, ws_splits, scale_log2);
  } else {
    kernel<<<grid, kThreads, smem, stream>>>(q, kv, kv_len, ws, out, n_heads, group, head_groups, head_dim, ws_splits,
                                             scale_log2);
  }
  KILN_CUDA_CHECK_LAUNCH();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(n_heads), unsigned(batch));
  cfg.blockDim = dim3(kAttnMaxHeadDim);
  cfg.dynamicSmemBytes = size_t(P) * sizeof(float);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_ok ? 1 : 0;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_q8_combine_kernel, ws, kv_len, out, n_heads, head_dim, ws_splits, P));
  KILN_CUDA_CHECK_LAUNCH();
}

template <int D, bool kPaged>
void launch_q8_format(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                      DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                      cudaStream_t stream) {
  if (kv.quant == KvQuant::int8)
    launch_q8<D, kPaged, KvQuant::int8>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
  else
    launch_q8<D, kPaged, KvQuant::fp8>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
}

}  // namespace

void attention_decode_q8(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                         DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                         cudaStream_t stream) {
  KILN_CUDA_REQUIRE(kv.quantized() && kv_quant_supported(head_dim) && kv.head_dim == head_dim,
                    "attention_decode_q8: needs a quantized KV layout and head_dim % 16 == 0, <= 128");
  KILN_CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  KILN_CUDA_REQUIRE(attn::aligned16(q) && attn::aligned16(out) && attn::aligned16(kv.k8) && attn::aligned16(kv.v8) &&
                        kv.head_dim % 16 == 0,
                    "attention_decode_q8: q, out and the K/V bytes must be 16-byte aligned");
  KILN_CUDA_REQUIRE(batch < 65536, "attention: batch too large");
  if (batch == 0) return;
  KILN_CUDA_REQUIRE(max_kv_len < (int64_t(1) << 31), "attention: max_kv_len too large");
  KILN_CUDA_REQUIRE(!kv.paged() || (kv.block_shift >= 0 && kv.block_shift <= 20 && kv.bt_stride > 0),
                    "attention: bad paged KV layout (block_size must be a power of two)");
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
}

}  // namespace kiln::cuda
