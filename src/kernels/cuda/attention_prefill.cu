// Causal prefill attention: versions 2 (mma.sync, below) and 1 (fp32 fallback), and the dispatch
// among them and version 3 (wgmma + TMA on sm_90a, attention_prefill_wgmma.cu: the default for
// contiguous K/V with head dim 64 or 128 there).
//
// Version 2 (prefill_mma_kernel<D, kPaged>, D = 64 for head_dim 64, D = 128 for head dims
// 72..128 with the dims past head_dim zero-padded): FlashAttention-2 on the tensor cores. Block = 4 warps = 64 query
// rows of one query head, each warp 16 rows; bf16 mma.sync m16n8k16 (fp32 accumulators), K by
// ldmatrix, V by ldmatrix.trans, from XOR-swizzled shared tiles of 64 positions, double-buffered
// with cp.async (tile t+1 loads while tile t is computed). Online softmax in registers on
// log2(e)-prescaled scores with exp2f. Tiles above the block's last row are never loaded; a warp
// skips tiles above its own rows; only tiles crossing the diagonal are masked. GQA: the block reads
// KV head h / group through KvLayout (no copies); the grid runs the heads of one query tile next
// to each other (blockIdx.x = head) so a group's K/V tiles are shared in L2, and the last (longest)
// query tiles first. Q is staged through the second K buffer before the loop.
//
// Paged KV (kv.block_table set): prefill_mma_kernel<D, kPaged = true> addresses every K/V tile
// row through row 0 of the block table (the caller passes the entry's row as kv_row_view), with
// the block ids of the next tile fetched while the current one is computed (PagedTileLoader);
// 4096-token causal prefill, 32/8 heads, d 128: 725 us paged vs 662 us contiguous on the H200.
// The fallback goes through KvLayout::offset, which branches on the form.
//
// Fallback (prefill_fp32_kernel, the previous CUDA-core kernel): any head_dim % 8 == 0 <= 128 whose
// pointers or strides are not 16-byte aligned (cp.async needs it). Block = 4 warps = 32 query rows;
// K/V tiles of 32 positions converted to fp32 in shared memory; lane j scores key j of the tile.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/epilogue.cuh"

namespace kiln::cuda {
namespace {

constexpr int kTileQ = 32, kTileK = 32, kWarps = 4, kRowsPerWarp = kTileQ / kWarps;
constexpr int kDimsPerLane = kAttnMaxHeadDim / 32;

__global__ void __launch_bounds__(kWarps * 32)
    prefill_fp32_kernel(const bf16* __restrict__ q, KvLayout kv, bf16* __restrict__ out, int64_t n_q, int64_t q_start,
                   int n_heads, int group, int d, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;                 // (kTileQ, d)
  float* ks = qs + kTileQ * d;      // (kTileK, d + 1)
  float* vs = ks + kTileK * (d + 1);  // (kTileK, d)
  const int h = blockIdx.y, kvh = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q0 = int64_t(blockIdx.x) * kTileQ;
  const int64_t rows = imin64(kTileQ, n_q - q0);

  for (int i = threadIdx.x; i < kTileQ * d; i += blockDim.x) {
    int r = i / d, c = i % d;
    qs[i] = r < rows ? __bfloat162float(q[((q0 + r) * n_heads + h) * d + c]) * scale : 0.0f;
  }

  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) o[i][c] = 0.0f;
  }

  const int64_t n_keys = q_start + q0 + rows;  // the last row of the tile sees this many keys
  for (int64_t k0 = 0; k0 < n_keys; k0 += kTileK) {
    __syncthreads();  // the previous tile is consumed (and qs is written, the first time)
    for (int i = threadIdx.x; i < kTileK * d; i += blockDim.x) {
      int r = i / d, c = i % d;
      int64_t pos = k0 + r;
      bool ok = pos < n_keys;
      int64_t off = kv.offset(0, ok ? pos : 0, kvh) + c;
      ks[r * (d + 1) + c] = ok ? __bfloat162float(kv.k[off]) : 0.0f;
      vs[r * d + c] = ok ? __bfloat162float(kv.v[off]) : 0.0f;
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp * kRowsPerWarp + i;
      if (r >= rows) continue;  // uniform over the warp
      const int64_t q_pos = q_start + q0 + r, k_pos = k0 + lane;
      if (k0 > q_pos) continue;  // the whole tile is in this row's future
      float s = -INFINITY;
      if (k_pos <= q_pos) {
        s = 0.0f;
        const float* qr = qs + r * d;
        const float* kr = ks + lane * (d + 1);
        for (int c = 0; c < d; ++c) s = fmaf(qr[c], kr[c], s);
      }
      float tile_max = s;
      for (int off = 16; off > 0; off >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      const float m_new = fmaxf(m[i], tile_max);  // finite: key k0 <= q_pos is visible
      const float p = __expf(s - m_new), corr = __expf(m[i] - m_new);
      float p_sum = p;
      for (int off = 16; off > 0; off >>= 1) p_sum += __shfl_xor_sync(0xffffffffu, p_sum, off);
      l[i] = l[i] * corr + p_sum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < kDimsPerLane; ++c) o[i][c] *= corr;
      for (int j = 0; j < kTileK; ++j) {
        float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int c = 0; c < kDimsPerLane; ++c) {
          int dim = lane + 32 * c;
          if (dim < d) o[i][c] = fmaf(pj, vs[j * d + dim], o[i][c]);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    if (r >= rows) continue;
    bf16* orow = out + ((q0 + r) * n_heads + h) * d;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      int dim = lane + 32 * c;
      if (dim < d) orow[dim] = __float2bfloat16(o[i][c] / l[i]);
    }
  }
}

// ---- tensor-core path ----
constexpr int kMmaWarps = 4, kMmaThreads = kMmaWarps * 32, kMmaTileQ = kMmaWarps * 16;
static_assert(kMmaTileQ == attn::kTileKv, "the Q tile is staged in a K buffer");
static_assert(kMmaTileQ == kPrefillTileRows, "varlen tiles are the kernel's query tiles");

template <int D>
constexpr size_t mma_smem_bytes() {
  return size_t(4) * attn::kTileKv * D * sizeof(bf16);  // 2 stages x (K, V)
}

// kVarlen (paged only): blockIdx.y indexes `tiles`, one PrefillTile per 64-row query tile of many
// chunks; the block then runs as a one-tile launch of that chunk (q, out, n_q, q_start and the
// table row replaced by the tile's), so each tile computes exactly what the per-chunk launch does.
template <int D, bool kPaged, bool kVarlen = false>
__global__ void __launch_bounds__(kMmaThreads, D == 128 ? 2 : 3)
    prefill_mma_kernel(const bf16* __restrict__ q, KvLayout kv, bf16* __restrict__ out, int n_q, int q_start,
                       int n_heads, int group, int d, float scale_log2, const PrefillTile* __restrict__ tiles = nullptr) {
  using namespace attn;
  extern __shared__ uint4 smem_raw[];
  bf16* const sm = reinterpret_cast<bf16*>(smem_raw);
  const int h = blockIdx.x, kvh = h / group;
  int q0_ = (int(gridDim.y) - 1 - int(blockIdx.y)) * kMmaTileQ;  // longest tiles first
  if constexpr (kVarlen) {
    const PrefillTile t = tiles[blockIdx.y];
    q += int64_t(t.row0) * n_heads * d;
    out += int64_t(t.row0) * n_heads * d;
    n_q = t.rows;
    q_start = t.q_start;
    kv.block_table += int64_t(t.table_row) * kv.bt_stride;
    q0_ = 0;
  }
  const int q0 = q0_;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int rows = min(kMmaTileQ, n_q - q0);
  const int kv_end = q_start + q0 + rows;  // keys the block's last row sees
  const int n_tiles = (kv_end + kTileKv - 1) / kTileKv;
  auto k_stage = [&](int st) { return sm + st * 2 * kTileKv * D; };
  auto v_stage = [&](int st) { return sm + st * 2 * kTileKv * D + kTileKv * D; };
  [[maybe_unused]] PagedTileLoader<D, kTileKv, kMmaThreads> paged;  // kPaged: block ids of the next tile
  auto load_kv = [&](int tile, int st) {  // paged: the ids were fetched by prefetch_ids(tile)
    const int k0 = tile * kTileKv, n = min(kTileKv, kv_end - k0);
    if constexpr (kPaged) {
      paged.load(k_stage(st), v_stage(st), kv, kvh, k0, n, d);
    } else {
      load_tile_async<D, kTileKv, kMmaThreads>(
          k_stage(st), n, d, [&](int r) { return kv.k + kv.offset_as<false>(0, k0 + r, kvh); }, kv.k);
      load_tile_async<D, kTileKv, kMmaThreads>(
          v_stage(st), n, d, [&](int r) { return kv.v + kv.offset_as<false>(0, k0 + r, kvh); }, kv.v);
    }
  };

  // Q through the stage-1 K buffer (free until tile 1 loads), tile 0 into stage 0.
  load_tile_async<D, kMmaTileQ, kMmaThreads>(
      k_stage(1), rows, d, [&](int r) { return q + (int64_t(q0 + r) * n_heads + h) * d; }, q);
  auto prefetch_ids = [&](int tile) {
    if constexpr (kPaged) {
      if (tile < n_tiles)
        paged.fetch(kv.block_table, kv.block_shift, tile * kTileKv, min(kTileKv, kv_end - tile * kTileKv));
    }
  };
  prefetch_ids(0);
  load_kv(0, 0);
  prefetch_ids(1);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[D / 16][4];
  load_q_frags<D>(qf, k_stage(1), warp * 16);

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  const int row_pos0 = q_start + q0 + warp * 16;  // position of this warp's first row
  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<0>();
    __syncthreads();  // tile landed for every thread; the other stage (and Q) is no longer read
    if (tile + 1 < n_tiles) {
      load_kv(tile + 1, (tile + 1) & 1);
      prefetch_ids(tile + 2);  // lands while this tile is computed
    }
    cp_async_commit();
    const int k0 = tile * kTileKv, st = tile & 1;
    if (k0 > row_pos0 + 15) continue;  // the whole tile is in the future of this warp's rows
    if (k0 + kTileKv - 1 > row_pos0) {  // crosses the diagonal of some row
      const int pos_g = row_pos0 + g - k0;  // row g's position relative to k0
      attend_tile<D, kTileKv, true>(qf, k_stage(st), v_stage(st), 0, m, l, o, scale_log2,
                                    [&](int i, int key) { return key <= pos_g + 8 * i; });
    } else {
      attend_tile<D, kTileKv, false>(qf, k_stage(st), v_stage(st), 0, m, l, o, scale_log2,
                                     [](int, int) { return true; });
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float inv = 1.0f / quad_sum(l[i]);
    const int r = warp * 16 + g + 8 * i;
    if (r < rows) {
      bf16* orow = out + (int64_t(q0 + r) * n_heads + h) * d;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int dim = n * 8 + 2 * t;
        if (dim < d)
          *reinterpret_cast<uint32_t*>(orow + dim) = pack_bf16(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
      }
    }
  }
}

template <int D, bool kPaged>
void launch_prefill_mma(const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start, int n_heads, int group,
                        int head_dim, cudaStream_t stream) {
  static std::once_flag configured;
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(prefill_mma_kernel<D, kPaged>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(mma_smem_bytes<D>())));
  });
  dim3 grid(unsigned(n_heads), unsigned((n_q + kMmaTileQ - 1) / kMmaTileQ));
  prefill_mma_kernel<D, kPaged><<<grid, kMmaThreads, mma_smem_bytes<D>(), stream>>>(
      q, kv, out, int(n_q), int(q_start), n_heads, group, head_dim,
      attn::kLog2e / sqrtf(float(head_dim)));
  KILN_CUDA_CHECK_LAUNCH();
}

// One launch for every tile: grid (heads, tiles), the tiles in the caller's order (longest first
// keeps the tail short).
template <int D>
void launch_prefill_varlen(const bf16* q, KvLayout kv, bf16* out, const PrefillTile* tiles, int64_t n_tiles,
                           int n_heads, int group, int head_dim, cudaStream_t stream) {
  static std::once_flag configured;
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(prefill_mma_kernel<D, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(mma_smem_bytes<D>())));
  });
  const dim3 grid{unsigned(n_heads), unsigned(n_tiles)};
  prefill_mma_kernel<D, true, true><<<grid, kMmaThreads, mma_smem_bytes<D>(), stream>>>(
      q, kv, out, 0, 0, n_heads, group, head_dim, attn::kLog2e / sqrtf(float(head_dim)), tiles);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace {
// Versions 3/4 (wgmma) by default where they can run; KILN_ATTN_PREFILL=mma keeps version 2.
bool wgmma_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_ATTN_PREFILL");
    return !(e && std::strcmp(e, "mma") == 0);
  }();
  return on;
}

bool mma_ok(const bf16* q, KvLayout kv, const bf16* out, int head_dim) {
  return attn::aligned16(q) && attn::aligned16(out) && attn::kv_fast_ok(kv) && head_dim % 8 == 0 &&
         head_dim <= kAttnMaxHeadDim;
}

void check_prefill_args(KvLayout kv, int64_t n_q, int64_t q_start, int n_heads, int n_kv_heads, int head_dim) {
  KILN_CUDA_REQUIRE(head_dim % 8 == 0 && head_dim <= kAttnMaxHeadDim, "attention: head_dim must be a multiple of 8, <= 128");
  KILN_CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  KILN_CUDA_REQUIRE(!kv.quantized(), "attention_prefill reads bf16 K/V: dequantize a quantized cache first (kv_dequantize)");
  KILN_CUDA_REQUIRE(q_start + n_q < (int64_t(1) << 31) && n_q < int64_t(65535) * 64, "attention: prefill too long");
  KILN_CUDA_REQUIRE(!kv.paged() || (kv.block_shift >= 0 && kv.block_shift <= 20 && kv.bt_stride > 0),
                    "attention: bad paged KV layout (block_size must be a power of two)");
}

void launch_mma(const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start, int n_heads, int group,
                int head_dim, cudaStream_t stream) {
  // Instantiations: D in {64, 128} x {contiguous, paged}; head dims 8..64 run in the 64-wide tile,
  // 72..128 in the 128-wide one.
  if (kv.paged()) {
    if (head_dim <= 64)
      launch_prefill_mma<64, true>(q, kv, out, n_q, q_start, n_heads, group, head_dim, stream);
    else
      launch_prefill_mma<128, true>(q, kv, out, n_q, q_start, n_heads, group, head_dim, stream);
  } else {
    if (head_dim <= 64)
      launch_prefill_mma<64, false>(q, kv, out, n_q, q_start, n_heads, group, head_dim, stream);
    else
      launch_prefill_mma<128, false>(q, kv, out, n_q, q_start, n_heads, group, head_dim, stream);
  }
}

void launch_fp32(const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start, int n_heads, int group,
                 int head_dim, cudaStream_t stream) {
  size_t smem = size_t(kTileQ * head_dim + kTileK * (head_dim + 1) + kTileK * head_dim) * sizeof(float);
  static std::once_flag configured;
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(prefill_fp32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int((3 * kTileQ * kAttnMaxHeadDim + kTileK) * sizeof(float))));
  });
  dim3 grid(unsigned((n_q + kTileQ - 1) / kTileQ), unsigned(n_heads));
  prefill_fp32_kernel<<<grid, kWarps * 32, smem, stream>>>(q, kv, out, n_q, q_start, n_heads, group, head_dim,
                                                           1.0f / sqrtf(float(head_dim)));
  KILN_CUDA_CHECK_LAUNCH();
}
}  // namespace

const char* attention_prefill_impl(const bf16* q, KvLayout kv, const bf16* out, int head_dim) {
  if (wgmma_enabled() && attention_prefill_wgmma_ok(q, kv, out, head_dim))
    return head_dim == 64 ? "wgmma-d64" : "wgmma-d128";
  if (!mma_ok(q, kv, out, head_dim)) return "fp32-fallback";
  return head_dim <= 64 ? "mma-d64" : "mma-d128";
}

bool attention_prefill_version(int version, const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start,
                               int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  check_prefill_args(kv, n_q, q_start, n_heads, n_kv_heads, head_dim);
  const int group = n_heads / n_kv_heads;
  switch (version) {
    case 3:
    case 4:
      if (!attention_prefill_wgmma_ok(q, kv, out, head_dim)) return false;
      return n_q == 0 ||
             attention_prefill_wgmma(version, q, kv, out, n_q, q_start, n_heads, n_kv_heads, head_dim, stream);
    case 2:
      if (!mma_ok(q, kv, out, head_dim)) return false;
      if (n_q > 0) launch_mma(q, kv, out, n_q, q_start, n_heads, group, head_dim, stream);
      return true;
    case 1:
      if (n_q > 0) launch_fp32(q, kv, out, n_q, q_start, n_heads, group, head_dim, stream);
      return true;
    default:
      return false;
  }
}

bool attention_prefill_varlen_ok(const bf16* q, KvLayout kv, const bf16* out, int head_dim) {
  return kv.paged() && !kv.quantized() && mma_ok(q, kv, out, head_dim);
}

void attention_prefill_varlen(const bf16* q, KvLayout kv, bf16* out, const PrefillTile* tiles, int64_t n_tiles,
                              int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  check_prefill_args(kv, 0, 0, n_heads, n_kv_heads, head_dim);
  KILN_CUDA_REQUIRE(attention_prefill_varlen_ok(q, kv, out, head_dim),
                    "attention_prefill_varlen: needs paged K/V and 16-byte aligned q, out, K/V and strides");
  KILN_CUDA_REQUIRE(n_tiles < 65536, "attention_prefill_varlen: at most 65535 tiles a launch");
  if (n_tiles == 0) return;
  const int group = n_heads / n_kv_heads;
  if (head_dim <= 64)
    launch_prefill_varlen<64>(q, kv, out, tiles, n_tiles, n_heads, group, head_dim, stream);
  else
    launch_prefill_varlen<128>(q, kv, out, tiles, n_tiles, n_heads, group, head_dim, stream);
}

void attention_prefill(const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start, int n_heads,
                       int n_kv_heads, int head_dim, cudaStream_t stream) {
  check_prefill_args(kv, n_q, q_start, n_heads, n_kv_heads, head_dim);
  if (n_q == 0) return;
  const int group = n_heads / n_kv_heads;
  if (wgmma_enabled() && attention_prefill_wgmma(kPrefillWgmmaVersion, q, kv, out, n_q, q_start, n_heads, n_kv_heads,
                                                 head_dim, stream))
    return;
  if (mma_ok(q, kv, out, head_dim)) {
    launch_mma(q, kv, out, n_q, q_start, n_heads, group, head_dim, stream);
    return;
  }
  launch_fp32(q, kv, out, n_q, q_start, n_heads, group, head_dim, stream);
}

}  // namespace kiln::cuda
