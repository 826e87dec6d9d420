// Causal prefill attention on Hopper (sm_90a) in the FlashAttention-3 manner: wgmma + TMA with
// warp specialization: versions 3 and 4 of attention_prefill (attention_prefill.cu keeps version 2, the
// mma.sync FlashAttention-2 kernel, for sm_80, paged K/V, head dims 80/96 and as the lab baseline).
//
// Scope: contiguous K/V (the single-sequence KvLayout, sequence 0), head_dim 64 or 128, bf16, any
// n_q and q_start (chunked prefill of one sequence), GQA by indexing the KV head. Paged K/V (the
// engine's chunked prefill through block tables) stays on version 2: a TMA box cannot follow a
// block table without one copy per block. The varlen form (attention_prefill_varlen_wgmma, session
// 36) runs many chunks' 64-row query tiles in one launch over contiguous K/V rows: the compact bf16
// copy a quantized pool's mixed step dequantizes its prefill chunks' positions into.
//
// Block = 3 warpgroups (384 threads) for one query head and a 128-row query tile:
//   warpgroup 0, producer (setmaxnreg.dec 24): one thread issues TMA copies (3-D tensor maps over
//     (head_dim, heads, positions), boxes of 64 dims x 1 head x 128 rows, 128-byte swizzle) of the
//     Q tile once, then of K and V tiles of 128 positions into a 2-stage ring: k_full[s] and
//     v_full[s] complete on the TMA transaction bytes (V lands while S = Q K^T is computed),
//     empty[s] (count 2) when both consumers are done with stage s.
//   warpgroups 1 and 2, consumers (setmaxnreg.inc 240): consumer c owns query rows 64c .. 64c+63.
//     Per K/V tile: S(64x128) = Q K^T by wgmma m64n128k16 from shared memory (K-major, D/16 steps,
//     first step overwrites), causal mask only on tiles that cross the diagonal, online softmax in
//     registers (exp2 on log2e-prescaled scores; each row lives in one quad of lanes), P converted
//     to bf16 in registers in the A-fragment layout, O(64xD) += P V by wgmma m64nDk16 with A from
//     registers and V from shared memory MN-major (imm-trans-b: V is stored (positions, dims), as
//     TMA copied it; no transpose pass).
//   Tiles are visited from the diagonal down to position 0 (the masked ones first); tiles above
//   the block's last row are never loaded, and a consumer whose 64 rows all precede a tile skips
//   its math. Grid (head, query tile), last (longest) query tiles first, the heads of one query
//   tile next to each other so the 4 query heads of a KV group read its K/V tiles from L2.
//
// Shared layout (1024-byte aligned): Q (2 boxes of 128 rows x 128 B at D 128), then per stage K and
// V tiles (D/64 boxes of 128 rows x 128 B each), then the mbarriers. Descriptors: K-major 128B
// swizzle as in gemm_wgmma.cu (SBO 1024 B between 8-row groups, +32 B per 16-wide K step inside a
// 64-wide box, the next box at +16 KB); V, MN-major 128B swizzle: start at key 16 kk (+2048 B),
// SBO = 1024 B (8-key groups along K), LBO = 16 KB (the next 64-dim box along N).
//
// Measured (H200, 32/8 heads, d 128, causal, FlashAttention's FLOP count): version 3 493 TFLOP/s at
// 4k tokens and 588 at 16k (version 2: 208 / 223; PyTorch SDPA cuDNN 416-457 / 599-653 in the
// same runs); version 4 (the overlap below) 405 / 428, so 3 is the default (kPrefillWgmmaVersion).
//
// Accumulator layout (m64nN, per warpgroup; warp w, lane l): d[4j + e] is row 16w + l/4 + 8(e>>1),
// column 8j + 2(l%4) + (e&1). The A fragment of a 16-wide K step kk in registers is
// (d[8kk], d[8kk+1]), (d[8kk+2], d[8kk+3]), (d[8kk+4], d[8kk+5]), (d[8kk+6], d[8kk+7]) packed to bf16x2:
// the mma.sync m16n8k16 A layout, which is what wgmma expects per warp.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cmath>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBN = 128;
constexpr float kLog2e = 1.4426950408889634f;

// kCons consumer warpgroups of 64 query rows each (a query tile of 64 kCons rows), kStg K/V stages
// and kQBufs Q buffers. Versions 3 and 4: (2, 2, 1). The varlen form: (1, 1, 2), two blocks a SM.
template <int D, int kCons = 2, int kStg = 2, int kQBufs = 1>
struct FaCfg {
  static_assert(D == 64 || D == 128, "wgmma prefill: head_dim 64 or 128");
  static constexpr int kBM = 64 * kCons, kThreads = 128 * (1 + kCons);
  static constexpr int kBoxBytes = 128 * 128;  // one K or V box: 128 rows x 128 B (a Q box: kBM rows)
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kTileBytes = kBN * D * 2;  // one K or V tile
  static constexpr int kBarOffset = kQBufs * kQBytes + kStg * 2 * kTileBytes;
  static constexpr int kSmemBytes = kBarOffset + (2 * kQBufs + 3 * kStg) * 8 + 1024;  // + alignment slack
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_FA3_DEVICE 1
#endif

#ifdef KILN_FA3_DEVICE
using namespace wgmma_ptx;

// One 3-D TMA box at coordinates (c0, c1, c2) into shared memory, completing on mbarrier bar.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// MN-major 128B-swizzle descriptor: lbo = bytes between 64-element groups along N, sbo = bytes
// between 8-row groups along K.
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// D(64, 128) (+)= A(64, 16) . B(128, 16)^T, A and B from shared memory (K-major, 128B swizzle);
// accumulate = 0 overwrites D.
__device__ __forceinline__ void wgmma_ss_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KILN_WGMMA_ACC64_REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : KILN_WGMMA_ACC64_OUT(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D(64, 128) += A(64, 16) . B(16, 128), A from registers (per warp the mma.sync m16n8k16 A-fragment
// layout), B from shared memory MN-major (row k of B contiguous in N: imm-trans-b = 1), 128B swizzle.
__device__ __forceinline__ void wgmma_rs_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KILN_WGMMA_ACC64_REGS ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : KILN_WGMMA_ACC64_OUT(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// D(64, 64) += A(64, 16) . B(16, 64), A from registers (per warp the mma.sync m16n8k16 A-fragment
// layout), B from shared memory MN-major (row k of B contiguous in N: imm-trans-b = 1), 128B swizzle.
__device__ __forceinline__ void wgmma_rs_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

template <int D>
__device__ __forceinline__ void wgmma_pv(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t desc_v) {
  if constexpr (D == 128)
    wgmma_rs_m64n128k16(o, a, desc_v);
  else
    wgmma_rs_m64n64k16(o, a, desc_v);
}

// S(64 x 128) = Q K^T for this warpgroup: D/16 wgmmas, the first overwrites (no zeroing). Q's
// 64-dim boxes lie kQBoxBytes apart, K's kBoxBytes.
template <int D, int kQBoxBytes>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint64_t dq, uint32_t ks) {
  wgmma_fence();
#pragma unroll
  for (int hf = 0; hf < D / 64; ++hf)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      wgmma_ss_m64n128k16(s, dq + uint64_t((hf * kQBoxBytes) >> 4) + 2 * k,
                          sw128_desc(ks + hf * FaCfg<D>::kBoxBytes) + 2 * k, (hf | k) != 0);
  wgmma_commit();
}

// O(64 x D) += P V, P from registers, V (128 keys x D) MN-major at vs.
template <int D>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[8][4], uint32_t vs, uint32_t v_lbo,
                                         uint32_t v_sbo) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) wgmma_pv<D>(o, p[kk], desc_mn_major(vs + kk * 2048, v_lbo, v_sbo));
  wgmma_commit();
}

// Keeps P's registers alive (unreused) until the wgmma reading them has been waited for.
__device__ __forceinline__ void fence_p(uint32_t (&p)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(p[kk][e])::"memory");
}

// Causal mask (keys after the row: -inf) when the tile at k0 crosses the diagonal of a row of this
// warpgroup, then the online-softmax step on the 2 rows of this thread: new running max m, the
// factor corr by which the old O and l shrink, this tile's row sums, and s turned into
// probabilities in place. row_pos: this thread's row i = 0 (row 1 is 8 further), t = lane % 4.
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&m)[2], float (&corr)[2], float (&sum)[2],
                                             bool mask, int k0, int row_pos, int t, float scale_log2) {
  if (mask) {
#pragma unroll
    for (int jj = 0; jj < 16; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (k0 + 8 * jj + 2 * t + (e & 1) > row_pos + 8 * (e >> 1)) s[4 * jj + e] = -INFINITY;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = m[i];
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) mx = fmaxf(mx, fmaxf(s[4 * jj + 2 * i], s[4 * jj + 2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;  // a row with nothing visible yet
    corr[i] = exp2f(m[i] * scale_log2 - base);                    // m = -inf: 0 (o, l are 0 anyway)
    m[i] = mx;
    float acc = 0.0f;
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      s[4 * jj + 2 * i] = exp2f(fmaf(s[4 * jj + 2 * i], scale_log2, -base));
      s[4 * jj + 2 * i + 1] = exp2f(fmaf(s[4 * jj + 2 * i + 1], scale_log2, -base));
      acc += s[4 * jj + 2 * i] + s[4 * jj + 2 * i + 1];
    }
    sum[i] = acc;
  }
}

// Probabilities (accumulator layout) -> bf16 A fragments of the 8 16-key steps.
__device__ __forceinline__ void to_a_frags(uint32_t (&p)[8][4], const float (&s)[64]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    p[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
    p[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    p[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    p[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

template <int D>
__device__ __forceinline__ void rescale(float (&o)[D / 2], float (&l)[2], const float (&corr)[2],
                                        const float (&sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = l[i] * corr[i] + sum[i];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[4 * n + 2 * i] *= corr[i], o[4 * n + 2 * i + 1] *= corr[i];
  }
}
#endif  // KILN_FA3_DEVICE

// kOverlap = false (version 3): per tile S = Q K^T, wait, softmax, O += P V, wait; the two consumer
// warpgroups overlap each other's softmax and wgmmas only through the warp schedulers.
// kOverlap = true (version 4, FlashAttention-3's intra-warpgroup pipelining): S of tile i+1 is
// issued before O += P_i V_i, and the softmax of tile i+1 runs while that PV wgmma is in flight; O
// is rescaled once the PV has retired. Costs the registers of a second P (32) and computes the one
// tile a chunked-prefill consumer could skip (all its rows before the tile).
// kVarlen (with kCons = 1, version 3's loop): blockIdx.y indexes `tiles`, one PrefillTile of 64
// query rows of one of many chunks, whose K/V rows start at the tile's kv_row0 of map_k / map_v
// and whose query rows at its row0 of map_q / out; blockIdx.x is a KV head, and the block runs the
// `group` query heads that read it one after the other, Q double-buffered (head i + 1's lands while
// head i is computed). At 128-token chunks a 64-row tile has one K/V tile to walk: it is loaded
// once for all the heads (kv_resident), so a block's fixed costs -- the tile lookup, the barrier
// set-up, the K/V load -- are paid once a group instead of once a head. Two blocks a SM (128
// registers a thread at launch, 24 / 232 after setmaxnreg; 97 KB of shared memory each).
template <int D, bool kOverlap, int kCons = 2, bool kVarlen = false>
__global__ void __launch_bounds__(FaCfg<D, kCons, kVarlen ? 1 : 2, kVarlen ? 2 : 1>::kThreads, kCons == 1 ? 2 : 1)
    fa3_prefill_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v, bf16* __restrict__ out, int n_q, int q_start,
                       int n_heads, int group, float scale_log2, uint32_t v_lbo, uint32_t v_sbo,
                       const PrefillTile* __restrict__ tiles) {
#ifdef KILN_FA3_DEVICE
  constexpr int kStages = kVarlen ? 1 : 2, kQBufs = kVarlen ? 2 : 1;
  using C = FaCfg<D, kCons, kStages, kQBufs>;
  constexpr int kBM = C::kBM, kQBoxBytes = kBM * 128;
  static_assert(!kVarlen || (kCons == 1 && !kOverlap), "the varlen form is version 3's loop on one consumer");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sq = smem_u32(smem);    // Q buffer b at sq + b kQBytes
  const uint32_t sk0 = sq + kQBufs * C::kQBytes;  // stage s: K at sk0 + 2 s kTileBytes, V kTileBytes further
  const uint32_t bar = sq + C::kBarOffset;
  auto q_smem = [&](int b) { return sq + b * C::kQBytes; };
  auto q_full = [&](int b) { return bar + 8 * b; };
  auto q_empty = [&](int b) { return bar + 8 * kQBufs + 8 * b; };
  auto k_full = [&](int s) { return bar + 16 * kQBufs + 8 * s; };
  auto v_full = [&](int s) { return bar + 16 * kQBufs + 8 * kStages + 8 * s; };
  auto empty = [&](int s) { return bar + 16 * kQBufs + 16 * kStages + 8 * s; };
  auto k_smem = [&](int s) { return sk0 + s * 2 * C::kTileBytes; };
  auto v_smem = [&](int s) { return sk0 + s * 2 * C::kTileBytes + C::kTileBytes; };

  // The block's query heads head0 .. head0 + n_hb - 1, all reading KV head kvh.
  const int n_hb = kVarlen ? group : 1;
  const int kvh = kVarlen ? int(blockIdx.x) : int(blockIdx.x) / group;
  const int head0 = kVarlen ? kvh * group : int(blockIdx.x);
  int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kBM;  // longest tiles first
  int q_row0 = 0, kv_row0 = 0;  // map rows of the block's query row 0 and of its sequence's position 0
  if constexpr (kVarlen) {
    const PrefillTile t = tiles[blockIdx.y];
    q0 = 0;
    q_row0 = t.row0;
    n_q = t.rows;
    q_start = t.q_start;
    kv_row0 = t.kv_row0;
    out += int64_t(t.row0) * n_heads * D;
  }
  const int rows = min(kBM, n_q - q0);
  const int kv_end = q_start + q0 + rows;  // keys the block's last row sees
  const int n_tiles = (kv_end + kBN - 1) / kBN;
  const bool kv_resident = n_hb > 1 && n_tiles == 1;  // one K/V tile serves every head of the block
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < kQBufs; ++b) {
      mbar_init(q_full(b), 1);
      mbar_init(q_empty(b), kCons);
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(empty(s), kCons);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_q)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_k)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_v)) : "memory");
      int kv_use = 0;  // K/V tiles loaded so far (ring slot and phase)
      for (int hi = 0; hi < n_hb; ++hi) {
        const int qb = hi % kQBufs;
        mbar_wait(q_empty(qb), (uint32_t(hi / kQBufs) & 1) ^ 1);  // the consumers are done with head hi - kQBufs
        mbar_arrive_expect_tx(q_full(qb), C::kQBytes);
#pragma unroll
        for (int hf = 0; hf < D / 64; ++hf)
          tma_load_3d(q_smem(qb) + hf * kQBoxBytes, &map_q, q_full(qb), hf * 64, head0 + hi, q_row0 + q0);
        if (kv_resident && hi > 0) continue;
        for (int it = 0; it < n_tiles; ++it, ++kv_use) {
          const int j = n_tiles - 1 - it, s = kv_use % kStages;
          const uint32_t use = uint32_t(kv_use / kStages);
          mbar_wait(empty(s), (use & 1) ^ 1);  // every consumer released the stage's previous tile
          mbar_arrive_expect_tx(k_full(s), C::kTileBytes);
#pragma unroll
          for (int hf = 0; hf < D / 64; ++hf)
            tma_load_3d(k_smem(s) + hf * C::kBoxBytes, &map_k, k_full(s), hf * 64, kvh, kv_row0 + j * kBN);
          mbar_arrive_expect_tx(v_full(s), C::kTileBytes);
#pragma unroll
          for (int hf = 0; hf < D / 64; ++hf)
            tma_load_3d(v_smem(s) + hf * C::kBoxBytes, &map_v, v_full(s), hf * 64, kvh, kv_row0 + j * kBN);
        }
      }
    }
  } else {  // consumer c: query rows 64c .. 64c + 63 of the tile
    if constexpr (kCons == 2)
      asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    else
      asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1, w = tid / 32, l = tid % 32, t = l % 4;
    const int first_pos = q_start + q0 + 64 * c;     // position of this warpgroup's first row
    const int row_pos = first_pos + 16 * w + l / 4;  // this thread's row i = 0; row i = 1 is 8 further
    auto k0_of = [&](int it) { return (n_tiles - 1 - it) * kBN; };
    int kv_use = 0;  // as the producer counts
    for (int hi = 0; hi < n_hb; ++hi) {
      const int h = head0 + hi, qb = hi % kQBufs;
      float o[D / 2];
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
      float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}, corr[2], sum[2];
      float s_acc[64];
      uint32_t p[8][4];
      const uint64_t dq = sw128_desc(q_smem(qb) + c * 64 * 128);  // row 64c of each Q box
      auto parity = [&](int it) { return uint32_t((kv_use + it) / kStages) & 1; };
      auto slot = [&](int it) { return (kv_use + it) % kStages; };
      mbar_wait(q_full(qb), uint32_t(hi / kQBufs) & 1);

      if constexpr (!kOverlap) {
        for (int it = 0; it < n_tiles; ++it) {
          const int s = slot(it), k0 = k0_of(it);
          mbar_wait(k_full(s), parity(it));
          if (k0 <= first_pos + 63) {  // some row of this warpgroup sees a key of the tile
            issue_qk<D, kQBoxBytes>(s_acc, dq, k_smem(s));
            wgmma_wait<0>();
            fence_acc<64>(s_acc);
            softmax_tile(s_acc, m, corr, sum, k0 + kBN - 1 > first_pos, k0, row_pos, t, scale_log2);
            rescale<D>(o, lsum, corr, sum);
            to_a_frags(p, s_acc);
            mbar_wait(v_full(s), parity(it));
            issue_pv<D>(o, p, v_smem(s), v_lbo, v_sbo);
            wgmma_wait<0>();
            fence_acc<D / 2>(o);
            fence_p(p);
          } else {
            mbar_wait(v_full(s), parity(it));  // nothing to compute, but keep the ring's phases in step
          }
          if (tid == 0 && !kv_resident) mbar_arrive(empty(s));
        }
      } else {  // version 4: one head a block (n_hb == 1, kv_use == 0)
        // Prologue: S and P of tile 0 (the diagonal one).
        mbar_wait(k_full(0), 0);
        issue_qk<D, kQBoxBytes>(s_acc, dq, k_smem(0));
        wgmma_wait<0>();
        fence_acc<64>(s_acc);
        softmax_tile(s_acc, m, corr, sum, k0_of(0) + kBN - 1 > first_pos, k0_of(0), row_pos, t, scale_log2);
        rescale<D>(o, lsum, corr, sum);
        to_a_frags(p, s_acc);
        // Steady state (the last tile peeled off below, so every wgmma group here is unconditional).
        for (int it = 0; it + 1 < n_tiles; ++it) {
          const int s = slot(it), s1 = slot(it + 1);
          mbar_wait(k_full(s1), parity(it + 1));
          issue_qk<D, kQBoxBytes>(s_acc, dq, k_smem(s1));  // S of the next tile, in flight with this tile's PV
          mbar_wait(v_full(s), parity(it));
          issue_pv<D>(o, p, v_smem(s), v_lbo, v_sbo);
          wgmma_wait<1>();  // the next S is done (groups retire in order); this PV may still run
          fence_acc<64>(s_acc);
          const int k0 = k0_of(it + 1);
          softmax_tile(s_acc, m, corr, sum, k0 + kBN - 1 > first_pos, k0, row_pos, t, scale_log2);
          wgmma_wait<0>();  // this tile's PV retired: O may be rescaled, P rewritten, the stage freed
          fence_acc<D / 2>(o);
          fence_p(p);
          if (tid == 0) mbar_arrive(empty(s));
          rescale<D>(o, lsum, corr, sum);
          to_a_frags(p, s_acc);
        }
        {
          const int it = n_tiles - 1, s = slot(it);
          mbar_wait(v_full(s), parity(it));
          issue_pv<D>(o, p, v_smem(s), v_lbo, v_sbo);
          wgmma_wait<0>();
          fence_acc<D / 2>(o);
          fence_p(p);
          if (tid == 0) mbar_arrive(empty(s));
        }
      }
      if (!kv_resident) kv_use += n_tiles;
      if (tid == 0) mbar_arrive(q_empty(qb));  // every wgmma reading this Q buffer has retired

      // Epilogue: normalize and store bf16 pairs straight from the accumulators.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float tot = lsum[i];
        tot += __shfl_xor_sync(0xffffffffu, tot, 1);
        tot += __shfl_xor_sync(0xffffffffu, tot, 2);
        const float inv = 1.0f / tot;
        const int r = q0 + 64 * c + 16 * w + l / 4 + 8 * i;
        if (r < n_q) {
          bf16* orow = out + (int64_t(r) * n_heads + h) * D;
#pragma unroll
          for (int n = 0; n < D / 8; ++n)
            *reinterpret_cast<uint32_t*>(orow + 8 * n + 2 * t) =
                pack_bf16(o[4 * n + 2 * i] * inv, o[4 * n + 2 * i + 1] * inv);
        }
      }
    }
  }
#else
  __trap();  // not built for sm_90a: the host never launches this (fa3_available)
#endif
}

// (positions, heads, head_dim) bf16 with the given element strides -> 3-D tensor map, boxes of
// 64 dims x 1 head x box_rows positions, 128-byte swizzle, zero fill past the last position.
bool make_map(CUtensorMap* map, const bf16* base, int64_t positions, int64_t heads, int64_t head_dim,
              int64_t head_stride, int64_t pos_stride, int box_rows = 128) {
  wgmma_ptx::EncodeTiled fn = wgmma_ptx::tensor_map_encoder();
  if (!fn) return false;
  cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(positions)};
  cuuint64_t strides[2] = {cuuint64_t(head_stride) * 2, cuuint64_t(pos_stride) * 2};  // bytes
  cuuint32_t box[3] = {64, 1, cuuint32_t(box_rows)};
  cuuint32_t elem_strides[3] = {1, 1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(base), dims, strides, box, elem_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Per device: compute capability 9.0, sm_90a machine code in the kernels, the tensor-map encoder,
// enough opt-in shared memory (wgmma_ptx::HopperProbe).
bool fa3_available() {
  static wgmma_ptx::HopperProbe probe;
  return probe.sms(FaCfg<128>::kSmemBytes, {reinterpret_cast<const void*>(fa3_prefill_kernel<128, false>),
                                            reinterpret_cast<const void*>(fa3_prefill_kernel<64, true>)}) > 0;
}

template <int D, bool kOverlap>
void launch_fa3(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv, bf16* out, int64_t n_q,
                int64_t q_start, int n_heads, int group, cudaStream_t stream) {
  static std::once_flag configured;
  constexpr auto kernel = fa3_prefill_kernel<D, kOverlap>;
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, FaCfg<D>::kSmemBytes));
  });
  const uint32_t lbo = FaCfg<D>::kBoxBytes, sbo = 1024;  // V descriptor strides (header)
  using C = FaCfg<D>;
  dim3 grid(unsigned(n_heads), unsigned((n_q + C::kBM - 1) / C::kBM));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(mq, mk, mv, out, int(n_q), int(q_start), n_heads, group,
                                                       kLog2e / sqrtf(float(D)), lbo, sbo, nullptr);
  KILN_CUDA_CHECK_LAUNCH();
}


template <int D>
void launch_fa3_varlen(const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv, bf16* out,
                       const PrefillTile* tiles, int64_t n_tiles, int n_heads, int group, cudaStream_t stream) {
  using C = FaCfg<D, 1, 1, 2>;
  static std::once_flag configured;
  constexpr auto kernel = fa3_prefill_kernel<D, false, 1, true>;
  std::call_once(configured, [] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  });
  const uint32_t lbo = C::kBoxBytes, sbo = 1024;  // V descriptor strides (header)
  const dim3 grid{unsigned(n_heads / group), unsigned(n_tiles)};  // (KV head, tile)
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(mq, mk, mv, out, 0, 0, n_heads, group,
                                                       kLog2e / sqrtf(float(D)), lbo, sbo, tiles);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_prefill_wgmma_ok(const bf16* q, KvLayout kv, const bf16* out, int head_dim) {
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return !kv.paged() && (head_dim == 64 || head_dim == 128) && a16(q) && a16(out) && a16(kv.k) && a16(kv.v) &&
         kv.pos_stride % 8 == 0 && kv.pos_stride > 0 && fa3_available();
}

bool attention_prefill_wgmma(int version, const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start,
                             int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream) {
  if ((version != 3 && version != 4) || !attention_prefill_wgmma_ok(q, kv, out, head_dim) || n_q <= 0) return false;
  const int64_t n_kv = q_start + n_q;
  CUtensorMap mq, mk, mv;
  if (!make_map(&mq, q, n_q, n_heads, head_dim, head_dim, int64_t(n_heads) * head_dim) ||
      !make_map(&mk, kv.k, n_kv, n_kv_heads, head_dim, head_dim, kv.pos_stride) ||
      !make_map(&mv, kv.v, n_kv, n_kv_heads, head_dim, head_dim, kv.pos_stride))
    return false;
  const int group = n_heads / n_kv_heads;
  const bool overlap = version == 4;
  if (head_dim == 128) {
    if (overlap)
      launch_fa3<128, true>(mq, mk, mv, out, n_q, q_start, n_heads, group, stream);
    else
      launch_fa3<128, false>(mq, mk, mv, out, n_q, q_start, n_heads, group, stream);
  } else {
    if (overlap)
      launch_fa3<64, true>(mq, mk, mv, out, n_q, q_start, n_heads, group, stream);
    else
      launch_fa3<64, false>(mq, mk, mv, out, n_q, q_start, n_heads, group, stream);
  }
  return true;
}

bool attention_prefill_varlen_wgmma(const bf16* q, int64_t q_rows, KvLayout kv, int64_t kv_rows, bf16* out,
                                    const PrefillTile* tiles, int64_t n_tiles, int n_heads, int n_kv_heads,
                                    int head_dim, cudaStream_t stream) {
  if (!attention_prefill_wgmma_ok(q, kv, out, head_dim) || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 ||
      n_tiles >= 65536 || q_rows >= (int64_t(1) << 31) || kv_rows >= (int64_t(1) << 31))
    return false;
  if (n_tiles <= 0) return true;
  CUtensorMap mq, mk, mv;
  if (!make_map(&mq, q, q_rows, n_heads, head_dim, head_dim, int64_t(n_heads) * head_dim, kPrefillTileRows) ||
      !make_map(&mk, kv.k, kv_rows, n_kv_heads, head_dim, head_dim, kv.pos_stride) ||
      !make_map(&mv, kv.v, kv_rows, n_kv_heads, head_dim, head_dim, kv.pos_stride))
    return false;
  const int group = n_heads / n_kv_heads;
  if (head_dim == 128)
    launch_fa3_varlen<128>(mq, mk, mv, out, tiles, n_tiles, n_heads, group, stream);
  else
    launch_fa3_varlen<64>(mq, mk, mv, out, tiles, n_tiles, n_heads, group, stream);
  return true;
}

}  // namespace kiln::cuda
