// Decode attention at many sequences as one continuous K/V stream per block (session 14).
//
// Why: with one split block per (sequence, KV head) -- P = 1, what decode_mma_kernel runs for
// batches of >= ~33 sequences -- a block's life at the continuous-batching shape (2048 sequences of
// 128..256 positions: 2..4 tiles of 64) is mostly its pipeline's fill and drain: it requests two
// tiles, waits a DRAM round trip with nothing else in flight, computes, merges its 4 warps and
// exits, and the next block starts from an empty pipeline. The kernel lab measured 2506 / 3237 /
// 3638 GB/s of K/V at 128 / 192 / 256 positions (59-86% of copy; session 7), the engine's 2048-row
// decode step 20 ms of 63 in the attention (session 11).
//
// Here a persistent grid (the blocks that fit, two per SM at d 128) walks the (sequence, KV head)
// pairs with a stride of the grid size (so every block sees every part of the batch: sequences
// admitted together have similar lengths, and contiguous ranges would hand some blocks far more
// tiles than others), and the cp.async pipeline runs over the concatenation of its pairs' tiles:
// the loads of the next pair's first tiles (and its q, in a q slot beside each K/V stage) are in
// flight while the current pair's last tile is computed and its 4 warps are merged and written.
// The per-tile arithmetic is decode_mma_kernel's (attend_tile; the same merge), so a sequence's
// output is bit-identical to that kernel's at P = 1.
//
// Limits: groups of at most 8 query heads per KV head (q slots of 8 rows; every Llama / Mistral /
// Qwen2 shape kiln runs), and only where two of its blocks fit on a SM (decode_stream_blocks_per_sm;
// what was measured): its merge area is beside the stages, 2,080 bytes per query head at head dim
// 128, so groups of 6-8 fit one block a SM there, where the split kernel fits two (putting the
// merge in the finished stage's memory would lift that; not done). The host falls
// back to decode_mma_kernel otherwise. PDL: a block whose first pair holds more tiles than it
// requests up front loads those older tiles before griddepcontrol.wait and the pair's q after it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/attention_decode_occupancy.h"
#include "kernels/cuda/attention_decode_stream.h"
#include "kernels/cuda/attention_decode_trace.h"
#include "kernels/cuda/attention_decode_walk.cuh"
#include "kernels/cuda/block_trace.cuh"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

// kStages = 3: two blocks a SM at d 128 for groups up to 5. (A 2-stage form, three blocks a SM
// where they fit, measured slower at 32/8 heads in session 14 -- 403 / 522 / 647 us against 327 /
// 435 / 547 at 2048 x 128 / 192 / 256 positions -- and was removed.)
constexpr int kThreads = 128, kQRows = 8, kStages = 3;

// Shared memory: kStages x (K tile, V tile, q slot of 8 rows), then the merge area of `group` rows:
// (max, sum) per warp and row, and each warp's (group, D) fp32 partial output.
template <int D>
constexpr int kStageElems = 2 * attn::kTileKv * D + kQRows * D;
template <int D>
size_t stream_smem_bytes(int group) {
  return size_t(kStages * kStageElems<D>) * sizeof(bf16) + size_t(4 * group * (2 + D)) * sizeof(float);
}

template <int D, bool kPaged>
__global__ void __launch_bounds__(kThreads, 2)
    decode_stream_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len,
                         bf16* __restrict__ out, int n_heads, int n_kv_heads, int group, int d, int batch,
                         float scale_log2, DecodeStreamPrologue prologue, uint64_t* __restrict__ trace) {
  using namespace attn;
  // KILN_ATTN_STREAM_TRACE (attention_decode_trace.h). (Stamped before pdl_wait too: no kernel
  // reads the trace, so the PDL contract's "writes nothing before the wait" is not at stake.)
  using Stamps = BlockStamps<DecodeStreamTrace::kBlocks, DecodeStreamTrace::kWords>;
  Stamps::enter(trace);
  extern __shared__ uint4 smem_raw[];
  bf16* const stages = reinterpret_cast<bf16*>(smem_raw);
  float* const ms = reinterpret_cast<float*>(stages + kStages * kStageElems<D>);  // (4, group)
  float* const ls = ms + 4 * group;                                                        // (4, group)
  float* const os = ls + 4 * group;                                                        // (4, group, D)
  auto k_stage = [&](int st) { return stages + st * kStageElems<D>; };
  auto v_stage = [&](int st) { return k_stage(st) + kTileKv * D; };
  auto q_slot = [&](int st) { return k_stage(st) + 2 * kTileKv * D; };
  const int warp = threadIdx.x / 32;

  const StreamWalk<kTileKv> walk(kv_len, batch, n_kv_heads, int(gridDim.x));  // a block is a worker
  StreamCursor rq = walk.start(blockIdx.x);  // the next tile to request
  StreamCursor cc = rq;                      // the next tile to compute

  [[maybe_unused]] PagedTileLoader<D, kTileKv, kThreads> paged;  // kPaged: the block ids of rq's tile
  auto fetch_ids = [&] {
    if constexpr (kPaged) {
      if (rq.b < batch)
        paged.fetch(kv.block_table + int64_t(rq.b) * kv.bt_stride, kv.block_shift, rq.tile * kTileKv,
                    min(kTileKv, rq.len - rq.tile * kTileKv));
    }
  };
  auto load_q = [&](int st, int b, int kvh) {  // the pair's query heads into stage st's q slot
    const bf16* qb = q + (int64_t(b) * n_heads + int64_t(kvh) * group) * d;
    load_tile_async<D, kQRows, kThreads>(q_slot(st), group, d, [&](int r) { return qb + r * d; }, q);
  };
  auto request = [&](int st, bool with_q = true, bool skip_newest = false) {  // attention_decode_walk.cuh's
    stream_request(rq, walk, batch, st, with_q,
                   [&](int s) {
                     load_kv_tile<D, kTileKv, kThreads, kPaged>(rq, kv, paged, k_stage(s), v_stage(s), d,
                                                                int(threadIdx.x), skip_newest);
                   },
                   load_q, fetch_ids);
  };

  fetch_ids();
  const StreamCursor first = rq;
  if (prologue.early_rows && first.b < batch && first.n_tiles <= kStages - 1) {
    const int newest = first.len - 1;  // its paged address looked up before the wait
    const int64_t newest_off = threadIdx.x < 2 * (D / 8) ? kv.offset_as<kPaged>(first.b, newest, first.kvh) : 0;
    auto load_newest = [&](int st) {
      load_newest_row<D>(kv, newest_off, k_stage(st), v_stage(st), newest - st * kTileKv, d, int(threadIdx.x));
    };
    stream_prologue_early_rows<kStages>(first, request, load_q, load_newest, [] { __syncthreads(); },
                                        [&] { Stamps::cycles(trace, DecodeStreamTrace::kAfterWait); });
  } else {
    stream_prologue<kStages>(rq, batch, request, load_q, [] { __syncthreads(); });
  }
  Stamps::cycles(trace, DecodeStreamTrace::kPrologueDone);

  uint32_t qf[D / 16][4];
  float m[2], l[2], o[D / 8][4];
  for (int item = 0; cc.b < batch; ++item) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // item's tile (and q) landed for every thread; the stage of item - 1 is free
    request((item + kStages - 1) % kStages);
    const int st = item % kStages, key0 = warp * 16;
    if (cc.tile == 0) {  // a new pair: its q, fresh softmax state
      load_q_frags8<D>(qf, q_slot(st));
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.0f;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    }
    const int visible_n = min(kTileKv, cc.len - cc.tile * kTileKv);
    if (visible_n >= kTileKv) {
      attend_tile<D, 16, false>(qf, k_stage(st), v_stage(st), key0, m, l, o, scale_log2, [](int, int) { return true; });
    } else if (key0 < visible_n) {
      attend_tile<D, 16, true>(qf, k_stage(st), v_stage(st), key0, m, l, o, scale_log2,
                               [&](int, int key) { return key < visible_n; });
    }
    if (cc.tile == cc.n_tiles - 1) {  // the pair's last tile: merge the 4 warps, write its heads
      Stamps::cycles(trace, DecodeStreamTrace::kAttendDone);
      store_warp_state<D>(ms, ls, os, group, m, l, o, scale_log2);
      __syncthreads();
      const int b = cc.b, kvh = cc.kvh;
      for (int i = threadIdx.x; i < group * d; i += kThreads) {
        const int r = i / d, c = i % d;
        const WarpMerge w = merge_warps<D>(ms, ls, os, group, r, c);
        out[(int64_t(b) * n_heads + int64_t(kvh) * group + r) * d + c] = __float2bfloat16(w.num / w.den);
      }
      Stamps::cycles(trace, DecodeStreamTrace::kMergeDone);
      // The next write of the merge area comes after at least one more top-of-loop barrier.
    }
    ++cc.tile;
    walk.settle(cc);
  }
  Stamps::cycles(trace, DecodeStreamTrace::kTilesDone);
  cp_async_wait<0>();
  Stamps::exit(trace);
}

// The kernel's attribute and its blocks per SM for each group size, set up once per instantiation.
template <int D, bool kPaged>
const GroupOccupancy& stream_occupancy() {
  static const GroupOccupancy o =
      measure_group_occupancy(decode_stream_kernel<D, kPaged>, kThreads, [](int g) { return stream_smem_bytes<D>(g); });
  return o;
}

template <int D, bool kPaged>
void launch_stream(const bf16* q, const KvLayout& kv, const int32_t* kv_len, bf16* out, int64_t batch, int n_heads,
                   int n_kv_heads, int head_dim, bool pdl, DecodeStreamPrologue prologue, cudaStream_t stream) {
  const int group = n_heads / n_kv_heads;
  const GroupOccupancy& occ = stream_occupancy<D, kPaged>();
  const int64_t pairs = batch * n_kv_heads;
  const int64_t blocks = std::min<int64_t>(pairs, int64_t(occ.sms) * std::max(1, occ.per_sm[group]));
  const float scale_log2 = attn::kLog2e / sqrtf(float(head_dim));
  launch_maybe_pdl(pdl, decode_stream_kernel<D, kPaged>, dim3(unsigned(blocks)), dim3(kThreads),
                   stream_smem_bytes<D>(group), stream, q, kv, kv_len, out, n_heads, n_kv_heads, group, head_dim,
                   int(batch), scale_log2, prologue, decode_stream_trace_next_slot());
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool decode_stream_applies(int n_heads, int n_kv_heads, int head_dim) {
  static_assert(kQRows == kDecodeMaxGroup, "a q slot holds the largest group");
  return persistent_decode_applies(n_heads, n_kv_heads, head_dim);
}

int decode_stream_blocks_per_sm(int n_heads, int n_kv_heads, int head_dim, bool paged) {
  const int group = n_heads / n_kv_heads;
  return with_decode_instance(head_dim, paged, [&](auto d, auto p) {
    return stream_occupancy<decltype(d)::value, decltype(p)::value>().per_sm[group];
  });
}

void attention_decode_stream(const bf16* q, const KvLayout& kv, const int32_t* kv_len, bf16* out, int64_t batch,
                             int n_heads, int n_kv_heads, int head_dim, bool pdl, DecodeStreamPrologue prologue,
                             cudaStream_t stream) {
  KILN_CUDA_REQUIRE(decode_stream_applies(n_heads, n_kv_heads, head_dim),
                    "attention: the streaming decode kernel needs at most 8 query heads per KV head");
  if (batch == 0) return;
  with_decode_instance(head_dim, kv.paged(), [&](auto d, auto p) {
    launch_stream<decltype(d)::value, decltype(p)::value>(q, kv, kv_len, out, batch, n_heads, n_kv_heads, head_dim,
                                                          pdl, prologue, stream);
  });
}

}  // namespace kiln::cuda
