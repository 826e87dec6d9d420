// Decode attention at many sequences as one K/V stream per warp, in slices of 16 positions (session 16).
//
// Why: the streaming kernel (attention_decode_stream.cu) moves K/V in tiles of 64 positions, 4
// warps a tile, 2 tiles in flight a block; its time goes by tile steps, not bytes. The kernel
// lab measured it at 92% of copy at 2048 x 192 positions (3 full tiles a pair), and the engine's
// 2048-row step at ~207 positions, 4 tiles of which the last holds 15 rows, took 601 us a layer
// against 438 (session 16, run 1; 4 / 3 of 438 is 584): a tile slot carrying 15 rows keeps as few
// bytes in flight as it carries, for a full tile's time. With lengths spread over 129..256 (the
// 2048 x 128/128 run) the slots are ~86% full on average.
//
// Here every warp is its own worker: it takes pairs w, w + W, ... (W = the grid's warps) and runs a
// ring of kSlots slices of 16 positions (K and V, 8 KB at d 128) through its own part of shared
// memory, the pair's q beside each slice's slot, with cp.async groups and __syncwarp only -- no
// block barrier, no merge of warps: the warp owns the pair's whole online softmax and writes the
// normalized output itself. The slots are full to within 16 rows a pair (98-99% at 130..256
// positions). Bytes in flight match the streaming kernel's: 2 slices a warp, 8 warps a SM at d
// 128 (128 KB). The price: a warp is a coarser unit of work than a block's share of a tile, so
// with fewer pairs than resident warps SM slots stay empty (the host takes this kernel from
// kDecodeSlicesPairsPer8Warps pairs per 8 resident warps on), and the fp32 sums run in another order than
// the streaming kernel's (same math; the outputs differ in the last bits, tested against the
// fp32 reference).
//
// Shared memory per warp: kSlots q slots of `group` rows (ldmatrix reads 8 rows: rows >= group
// read the next slot's, or slot 0's K, whose results are never used), then kSlots x (K, V) slices.
// PDL as the streaming kernel: when the warp's first pair has more slices than it requests up
// front, those older slices load before griddepcontrol.wait and the pair's q after it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/attention_decode_occupancy.h"
#include "kernels/cuda/attention_decode_slices.h"
#include "kernels/cuda/attention_decode_walk.cuh"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kSlice = 16, kSlots = 3;

template <int D>
constexpr int kSliceElems = 2 * kSlice * D;  // K then V of one slot
// Shared memory of one warp, in bf16 elements: q slots, then the slices.
template <int D>
__host__ __device__ constexpr int warp_elems(int group) {
  return kSlots * group * D + kSlots * kSliceElems<D>;
}
template <int D>
size_t slices_smem_bytes(int group) {
  return size_t(kWarps) * warp_elems<D>(group) * sizeof(bf16);
}

template <int D, bool kPaged>
__global__ void __launch_bounds__(kThreads, 2)
    decode_slices_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len,
                         bf16* __restrict__ out, int n_heads, int n_kv_heads, int group, int d, int batch,
                         float scale_log2) {
  using namespace attn;
  extern __shared__ uint4 smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  bf16* const mine = reinterpret_cast<bf16*>(smem_raw) + warp * warp_elems<D>(group);
  auto q_slot = [&](int st) { return mine + st * group * D; };
  auto k_slot = [&](int st) { return mine + kSlots * group * D + st * kSliceElems<D>; };
  auto v_slot = [&](int st) { return k_slot(st) + kSlice * D; };

  const StreamWalk<kSlice> walk(kv_len, batch, n_kv_heads, int(gridDim.x) * kWarps);  // a warp is a worker
  StreamCursor rq = walk.start(int64_t(blockIdx.x) * kWarps + warp);  // the next slice to request
  StreamCursor cc = rq;                                               // the next slice to compute

  [[maybe_unused]] PagedTileLoader<D, kSlice, 32> paged;  // kPaged: the block ids of rq's slice
  if constexpr (kPaged) paged.tid = lane;
  auto fetch_ids = [&] {
    if constexpr (kPaged) {
      if (rq.b < batch)
        paged.fetch(kv.block_table + int64_t(rq.b) * kv.bt_stride, kv.block_shift, rq.tile * kSlice,
                    min(kSlice, rq.len - rq.tile * kSlice));
    }
  };
  auto load_q = [&](int st, int b, int kvh) { load_pair_q<D>(q_slot(st), q, b, kvh, n_heads, group, d, lane); };
  auto request = [&](int st, bool with_q = true) {
    stream_request(rq, walk, batch, st, with_q,
                   [&](int s) { load_kv_tile<D, kSlice, 32, kPaged>(rq, kv, paged, k_slot(s), v_slot(s), d, lane); },
                   load_q, fetch_ids);
  };

  fetch_ids();
  stream_prologue<kSlots>(rq, batch, request, load_q, [] { __syncwarp(); });

  uint32_t qf[D / 16][4];
  float m[2], l[2], o[D / 8][4];
  for (int item = 0; cc.b < batch; ++item) {
    cp_async_wait<kSlots - 2>();
    __syncwarp();  // item's slice (and q) landed for every lane; every lane is done with item - 1's slot
    request((item + kSlots - 1) % kSlots);
    const int st = item % kSlots;
    if (cc.tile == 0) {  // a new pair: its q, fresh softmax state
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], q_slot(st) + swz<D>(lane & 7, kk * 2 + (lane >> 4)));
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.0f;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    }
    const int visible_n = min(kSlice, cc.len - cc.tile * kSlice);
    if (visible_n >= kSlice)
      attend_tile<D, kSlice, false>(qf, k_slot(st), v_slot(st), 0, m, l, o, scale_log2, [](int, int) { return true; });
    else
      attend_tile<D, kSlice, true>(qf, k_slot(st), v_slot(st), 0, m, l, o, scale_log2,
                                   [&](int, int key) { return key < visible_n; });
    if (cc.tile == cc.n_tiles - 1) {  // the pair's last slice: its query heads out (rows 8..15 repeat 0..7)
      const float den = quad_sum(l[0]);
      if (g < group) {
        bf16* dst = out + (int64_t(cc.b) * n_heads + int64_t(cc.kvh) * group + g) * d;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          const int c = n * 8 + 2 * t;
          if (c < d) *reinterpret_cast<__nv_bfloat162*>(dst + c) = __floats2bfloat162_rn(o[n][0] / den, o[n][1] / den);
        }
      }
    }
    ++cc.tile;
    walk.settle(cc);
  }
  cp_async_wait<0>();
}

// The kernel's attribute and its blocks per SM for each group size, set up once per instantiation.
template <int D, bool kPaged>
const GroupOccupancy& slices_occupancy() {
  static const GroupOccupancy o =
      measure_group_occupancy(decode_slices_kernel<D, kPaged>, kThreads, [](int g) { return slices_smem_bytes<D>(g); });
  return o;
}

}  // namespace

DecodeSlicesFit decode_slices_fit(int n_heads, int n_kv_heads, int head_dim, bool paged) {
  const int group = n_heads / n_kv_heads;
  return with_decode_instance(head_dim, paged, [&](auto d, auto p) {
    const GroupOccupancy& occ = slices_occupancy<decltype(d)::value, decltype(p)::value>();
    return DecodeSlicesFit{occ.per_sm[group], int64_t(occ.sms) * occ.per_sm[group] * kWarps};
  });
}

void attention_decode_slices(const bf16* q, const KvLayout& kv, const int32_t* kv_len, bf16* out, int64_t batch,
                             int n_heads, int n_kv_heads, int head_dim, bool pdl, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(persistent_decode_applies(n_heads, n_kv_heads, head_dim),
                    "attention: the slice decode kernel needs at most 8 query heads per KV head");
  if (batch == 0) return;
  const int group = n_heads / n_kv_heads;
  with_decode_instance(head_dim, kv.paged(), [&](auto dt, auto pt) {
    constexpr int D = decltype(dt)::value;
    constexpr bool P = decltype(pt)::value;
    const GroupOccupancy& occ = slices_occupancy<D, P>();
    const int64_t pairs = batch * n_kv_heads;
    const int64_t blocks = std::min<int64_t>((pairs + kWarps - 1) / kWarps, int64_t(occ.sms) * std::max(1, occ.per_sm[group]));
    const float scale_log2 = attn::kLog2e / sqrtf(float(head_dim));
    launch_maybe_pdl(pdl, decode_slices_kernel<D, P>, dim3(unsigned(blocks)), dim3(kThreads),
                     slices_smem_bytes<D>(group), stream, q, kv, kv_len, out, n_heads, n_kv_heads, group, head_dim,
                     int(batch), scale_log2);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::cuda
