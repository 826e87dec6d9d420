// Flash-decoding: one query token per sequence against its whole cache.
//
// Fast path (decode_mma_kernel<D, kPaged>, D = 64 or 128 with head dims below D zero-padded). Grid
// (P, KV head x head group, sequence); P is fixed on the host (graph replay) and the chunk of
// positions per block is derived from kv_len at run time (decode_chunk): blocks past the end exit
// before touching memory. A block = 4 warps takes the up-to-16 query heads of its KV group as the
// 16 rows of an mma tile and streams its chunk as K/V tiles of 64 positions through a 3-stage
// cp.async pipeline (two tiles = 64 KB in flight at D = 128 while one is computed, every load a
// 16-byte chunk of a K/V row); warp w scores keys 16w .. 16w+15 of every tile with bf16 mma.sync
// (fp32 accumulate) and keeps its own online softmax; the 4 warps merge through shared memory.
// A sequence whose length fits one chunk is normalized and written by its block; otherwise the
// unnormalized partial output and (max, sum) go to the workspace and the combine kernel merges only
// the ceil(kv_len / chunk) chunks that hold data.
//
// Paged KV (kv.block_table set, kv_layout.h): the same kernel instantiated with kPaged = true;
// each row of a K/V tile is addressed on its own through the block table (a 64-position tile
// spans several blocks), so only the row pointers change, not the tiling or the arithmetic:
// paged and contiguous layouts holding the same values give bit-identical outputs. The block ids
// of a tile are fetched into registers one tile ahead (PagedTileLoader, attention_mma.h): the
// lookup latency hides behind a tile's compute. Measured (H200, kernel lab, 16-token blocks in
// shuffled order, 32/8 heads, d 128): paged vs contiguous +4% at b=1 L=32k and b=64 L=2k, +9% at
// b=16 L=8k and b=256 L=512 (per-row lookups without the prefetch: +13..35%).
//
// Fallback (decode_split_fp32_kernel, the previous CUDA-core kernel, fixed 256-position splits over
// the capacity) when pointers or strides are not 16-byte aligned.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include <mutex>

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

// ---- tensor-core path ----
constexpr int kMmaThreads = 128, kMmaRows = 16, kStages = 3;
constexpr int kMinChunk = attn::kTileKv;

// Positions per split block for length len with P blocks: >= 64, a multiple of 64, P * chunk >= len.
__device__ __forceinline__ int decode_chunk(int len, int P) {
  const int per = (len + P - 1) / P;
  return max(kMinChunk, (per + kMinChunk - 1) / kMinChunk * kMinChunk);
}

template <int D>
constexpr size_t decode_smem_bytes() {
  return size_t(kMmaRows * D + kStages * 2 * attn::kTileKv * D) * sizeof(bf16);
}

template <int D, bool kPaged>
__global__ void __launch_bounds__(kMmaThreads, 2)
    decode_mma_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len, DecodeWorkspace ws,
                      bf16* __restrict__ out, int n_heads, int group, int head_groups, int d, int ws_splits,
                      float scale_log2) {
  using namespace attn;
  extern __shared__ uint4 smem_raw[];
  bf16* const qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* const stages = qs + kMmaRows * D;
  const int split = blockIdx.x, b = blockIdx.z;
  const int kvh = blockIdx.y / head_groups, hg = blockIdx.y % head_groups;
  const int h0 = kvh * group + hg * kMmaRows;       // first query head of this block
  const int nh = min(kMmaRows, group - hg * kMmaRows);  // query heads in this block
  const int len = kv_len[b];
  const int chunk = decode_chunk(len, int(gridDim.x));
  const int p0 = split * chunk;
  const int n_pos = min(chunk, len - p0);
  if (n_pos <= 0) return;  // past the end: nothing to read or write
  const bool single = len <= chunk;
  const int n_tiles = (n_pos + kTileKv - 1) / kTileKv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2;

  auto k_stage = [&](int st) { return stages + st * 2 * kTileKv * D; };
  auto v_stage = [&](int st) { return stages + st * 2 * kTileKv * D + kTileKv * D; };
  [[maybe_unused]] PagedTileLoader<D, kTileKv, kMmaThreads> paged;  // kPaged: block ids of the next tile
  auto load_kv = [&](int tile, int st) {  // paged: the ids were fetched by prefetch_ids(tile)
    const int k0 = p0 + tile * kTileKv, n = min(kTileKv, n_pos - tile * kTileKv);
    if constexpr (kPaged) {
      paged.load(k_stage(st), v_stage(st), kv, kvh, k0, n, d);
    } else {
      load_tile_async<D, kTileKv, kMmaThreads>(
          k_stage(st), n, d, [&](int r) { return kv.k + kv.offset_as<false>(b, k0 + r, kvh); }, kv.k);
      load_tile_async<D, kTileKv, kMmaThreads>(
          v_stage(st), n, d, [&](int r) { return kv.v + kv.offset_as<false>(b, k0 + r, kvh); }, kv.v);
    }
  };

  auto prefetch_ids = [&](int tile) {
    if constexpr (kPaged) {
      if (tile < n_tiles)
        paged.fetch(kv.block_table + int64_t(b) * kv.bt_stride, kv.block_shift, p0 + tile * kTileKv,
                    min(kTileKv, n_pos - tile * kTileKv));
    }
  };

  const bf16* qb = q + (int64_t(b) * n_heads + h0) * d;
  load_tile_async<D, kMmaRows, kMmaThreads>(qs, nh, d, [&](int r) { return qb + r * d; }, q);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) {
      prefetch_ids(st);
      load_kv(st, st);
    }
    cp_async_commit();  // group st (Q rides with group 0)
  }
  prefetch_ids(kStages - 1);

  cp_async_wait<kStages - 2>();  // group 0 (Q and tile 0) landed
  __syncthreads();
  uint32_t qf[D / 16][4];
  load_q_frags<D>(qf, qs, 0);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile landed for every thread; the stage of tile - 1 is free
    if (tile + kStages - 1 < n_tiles) {
      load_kv(tile + kStages - 1, (tile + kStages - 1) % kStages);
      prefetch_ids(tile + kStages);  // lands while this tile is computed
    }
    cp_async_commit();
    const int st = tile % kStages, key0 = warp * 16;
    const int visible_n = n_pos - tile * kTileKv;  // keys of this tile that exist
    if (visible_n >= kTileKv) {
      attend_tile<D, 16, false>(qf, k_stage(st), v_stage(st), key0, m, l, o, scale_log2,
                                [](int, int) { return true; });
    } else if (key0 < visible_n) {
      attend_tile<D, 16, true>(qf, k_stage(st), v_stage(st), key0, m, l, o, scale_log2,
                               [&](int, int key) { return key < visible_n; });
    }
  }

  // Merge the 4 warps through shared memory (reusing the stages): m in log2 units.
  cp_async_wait<0>();
  __syncthreads();
  float* const ms = reinterpret_cast<float*>(stages);       // (4, 16)
  float* const ls = ms + 4 * kMmaRows;                       // (4, 16)
  float* const os = ls + 4 * kMmaRows;                       // (4, 16, D)
  static_assert((8 * kMmaRows + 4 * kMmaRows * D) * sizeof(float) <= kStages * 2 * attn::kTileKv * D * sizeof(bf16));
  {
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float lsum = quad_sum(l[i]);
      const int r = g + 8 * i;
      if (t == 0) {
        ms[warp * kMmaRows + r] = m[i] == -INFINITY ? -INFINITY : m[i] * scale_log2;
        ls[warp * kMmaRows + r] = lsum;
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        float2 v = make_float2(o[n][2 * i], o[n][2 * i + 1]);
        *reinterpret_cast<float2*>(os + (warp * kMmaRows + r) * D + n * 8 + 2 * t) = v;
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh * d; i += kMmaThreads) {
    const int r = i / d, c = i % d;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) mx = fmaxf(mx, ms[w * kMmaRows + r]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float e = exp2f(ms[w * kMmaRows + r] - mx);  // a warp that saw no key: 0
      num += e * os[(w * kMmaRows + r) * D + c];
      den += e * ls[w * kMmaRows + r];
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

// Grid (n_heads, batch), 128 threads (one per output dim): merges the chunks that hold data.
__global__ void __launch_bounds__(kAttnMaxHeadDim)
    decode_combine_mma_kernel(DecodeWorkspace ws, const int32_t* __restrict__ kv_len, bf16* __restrict__ out,
                              int n_heads, int d, int ws_splits, int P) {
  const int h = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  const int len = kv_len[b];
  const int chunk = decode_chunk(len, P);
  if (len <= chunk) return;  // one chunk (or none): the split kernel wrote the output
  const int n_used = (len + chunk - 1) / chunk;
  const int64_t row = (int64_t(b) * n_heads + h) * ws_splits;
  float mx = -INFINITY;
  for (int s = 0; s < n_used; ++s) mx = fmaxf(mx, ws.partial_ml[(row + s) * 2]);
  float num = 0.0f, den = 0.0f;
  for (int s = 0; s < n_used; ++s) {
    const float w = exp2f(ws.partial_ml[(row + s) * 2] - mx);
    den += w * ws.partial_ml[(row + s) * 2 + 1];
    if (c < d) num += w * ws.partial_o[(row + s) * d + c];
  }
  if (c < d) out[(int64_t(b) * n_heads + h) * d + c] = __float2bfloat16(num / den);
}

template <int D, bool kPaged>
void launch_decode_mma(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                       DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                       cudaStream_t stream) {
  static std::once_flag configured;
  static int resident_blocks = 0;  // blocks of this kernel resident on the whole GPU
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(decode_mma_kernel<D, kPaged>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(decode_smem_bytes<D>())));
    int dev = 0, sms = 0, per_sm = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_mma_kernel<D, kPaged>, kMmaThreads,
                                                                  decode_smem_bytes<D>()));
    resident_blocks = std::max(1, sms * std::max(1, per_sm));
  });
  const int group = n_heads / n_kv_heads, head_groups = (group + kMmaRows - 1) / kMmaRows;
  const int ws_splits = int(decode_max_splits(max_kv_len));
  // Splits per (head group, sequence): enough blocks for about one wave of resident blocks at
  // lengths near the capacity; at shorter lengths the chunk floor of 64 leaves the rest idle.
  const int64_t pairs = batch * n_kv_heads * head_groups;
  const int P = int(std::clamp<int64_t>((resident_blocks + pairs - 1) / pairs, 1, std::max(1, ws_splits)));
  dim3 grid(unsigned(P), unsigned(n_kv_heads * head_groups), unsigned(batch));
  decode_mma_kernel<D, kPaged><<<grid, kMmaThreads, decode_smem_bytes<D>(), stream>>>(
      q, kv, kv_len, ws, out, n_heads, group, head_groups, head_dim, ws_splits,
      attn::kLog2e / sqrtf(float(head_dim)));
  KILN_CUDA_CHECK_LAUNCH();
  decode_combine_mma_kernel<<<dim3(unsigned(n_heads), unsigned(batch)), kAttnMaxHeadDim, 0, stream>>>(
      ws, kv_len, out, n_heads, head_dim, ws_splits, P);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

const char* attention_decode_impl(const bf16* q, KvLayout kv, const bf16* out, int head_dim) {
  const bool fast = attn::aligned16(q) && attn::aligned16(out) && attn::kv_fast_ok(kv) && head_dim % 8 == 0 &&
                    head_dim <= kAttnMaxHeadDim;
  if (!fast) return "fp32-fallback";
  return head_dim <= 64 ? "mma-d64" : "mma-d128";
}

DecodeWorkspace decode_workspace(float* base, int64_t batch, int n_heads, int head_dim, int64_t max_kv_len) {
  int64_t rows = batch * n_heads * decode_max_splits(max_kv_len);
  return DecodeWorkspace{base, base + rows * head_dim};
}

void attention_decode(const bf16* q, KvLayout kv, const int32_t* kv_len, int64_t max_kv_len, bf16* out,
                      DecodeWorkspace ws, int64_t batch, int n_heads, int n_kv_heads, int head_dim,
                      cudaStream_t stream) {
  KILN_CUDA_REQUIRE(head_dim % 8 == 0 && head_dim <= kAttnMaxHeadDim, "attention: head_dim must be a multiple of 8, <= 128");
  KILN_CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  KILN_CUDA_REQUIRE(batch < 65536, "attention: batch too large");
  if (batch == 0) return;
  KILN_CUDA_REQUIRE(max_kv_len < (int64_t(1) << 31), "attention: max_kv_len too large");
  KILN_CUDA_REQUIRE(!kv.paged() || (kv.block_shift >= 0 && kv.block_shift <= 20 && kv.bt_stride > 0),
                    "attention: bad paged KV layout (block_size must be a power of two)");
  if (attention_decode_impl(q, kv, out, head_dim)[0] == 'm') {
    // Instantiations: D in {64, 128} x {contiguous, paged}.
    if (kv.paged()) {
      if (head_dim <= 64)
        launch_decode_mma<64, true>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
      else
        launch_decode_mma<128, true>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
    } else {
      if (head_dim <= 64)
        launch_decode_mma<64, false>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
      else
        launch_decode_mma<128, false>(q, kv, kv_len, max_kv_len, out, ws, batch, n_heads, n_kv_heads, head_dim, stream);
    }
    return;
  }
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
