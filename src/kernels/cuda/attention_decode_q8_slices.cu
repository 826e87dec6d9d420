// The slice decode attention over the 8-bit KV cache (session 23): attention_decode_slices.cu's
// schedule -- every warp its own K/V stream over pairs w, w + W, ... in slices of 16 positions, no
// block barrier, no combine -- with a transposed slice step (attention_q8_slice_tile.cuh).
//
// Why: at 2048 sequences the 8-bit cache ran in the split kernel (64-position tiles, 4 warps a
// tile), which session 5 measured at the bf16 split kernel's tile rate whatever the bytes; the bf16
// cache meanwhile moved to the streaming kernel (session 14) and this slice schedule (session 16),
// so an fp8 cache made the 2048 x 128/128 run 10% *slower* than bf16 (session 20) although it reads
// half the bytes. With the split kernel's step in this schedule (this session's first version) the
// kernel ran at the bf16 slice kernel's slice rate, 47-50% of copy on its bytes; the transposed step
// halves the MMAs and drops the bf16 V tile, and f16 operands shorten the byte conversion: 2048
// sequences of 192 positions, fp8, 428.7 -> 271.9 -> 231.7 µs, 90% of copy (PERFORMANCE.md,
// session 23).
//
// Per warp and slot: K bytes (16, D), V bytes (16, D), 16 K scales, 16 V scales (4.2 KB at d 128,
// against the bf16 slice's 8 KB). Two configurations (kSlots slots a warp, kBlocks blocks of 4 warps
// a SM): 4 / 2 (3 slices in flight a warp, 8 warps) and 3 / 3 (2 in flight, 12 warps: more warps to
// hide a slice's dependent chain, the same bytes in flight).
// Shared memory per warp: kSlots q slots of `group` rows (rows >= group of the B fragments read
// the memory after the slot, results never used), then the raw slots.
// In a paged pool a 16-position slice of one KV head is one run of 16 x d bytes when the block size
// is 16 or more (kv_layout.h's head-major bytes). There (kRuns, session 33) one block id a slice
// addresses it; otherwise the block ids are fetched per row, as the split kernel does, so any
// power-of-two block size works. Either way the id is fetched one slice ahead. Session 33 found the
// kernel issue-bound in the engine at the H200's power-capped clock (752 instructions a slice);
// kRuns, the skipped rescale and the in-place e4m3 halves (attention_q8_slice_tile.cuh) cut that to 423
// (performance/attention.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/attention_decode_occupancy.h"
#include "kernels/cuda/attention_decode_slices.h"
#include "kernels/cuda/attention_decode_walk.cuh"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_q8_slice_tile.cuh"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kSlice = attn_q8s::kSlice;

// Bytes of one raw slot: K bytes, V bytes, K scales, V scales.
template <int D>
constexpr int kRawBytes = 2 * kSlice * D + 2 * kSlice * 4;
template <int D, int kSlots>
__host__ __device__ constexpr int q8_warp_bytes(int group) {
  return kSlots * group * D * 2 + kSlots * kRawBytes<D>;
}
template <int D, int kSlots>
size_t q8_slices_smem_bytes(int group) {
  return size_t(kWarps) * q8_warp_bytes<D, kSlots>(group);
}

// kRuns (paged, blocks of >= 16 positions, d == D): a slice lies inside one block, so its K bytes,
// V bytes and scales are three runs found from one block id (kv_layout.h's head-major form): one
// id load a slice instead of kPer + 1 a lane, and 32-bit offsets from one base instead of a 64-bit
// vector number per chunk. The same bytes land in the same shared memory: the same results.
// vote_group: `group`, or 0 to rescale O in every slice (attend_slice; KILN_ATTN_Q8_LAZY_RESCALE=0).
template <int D, bool kPaged, KvQuant F, int kSlots, int kBlocks, bool kRuns>
__global__ void __launch_bounds__(kThreads, kBlocks)
    decode_q8_slices_kernel(const bf16* __restrict__ q, KvLayout kv, const int32_t* __restrict__ kv_len,
                            bf16* __restrict__ out, int n_heads, int n_kv_heads, int group, int d, int batch,
                            float scale_log2, int vote_group) {
  using namespace attn;
  using namespace attn_q8s;
  constexpr int kCh = D / 16, kPer = kSlice * kCh / 32;  // 16-byte chunks of a row; a lane's per slice of K (of V)
  static_assert(kSlice * kCh % 32 == 0);
  extern __shared__ uint4 smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  char* const mine = reinterpret_cast<char*>(smem_raw) + warp * q8_warp_bytes<D, kSlots>(group);
  auto q_slot = [&](int st) { return reinterpret_cast<bf16*>(mine) + st * group * D; };
  char* const raw0 = mine + kSlots * group * D * 2;
  auto raw_k = [&](int st) { return reinterpret_cast<uint8_t*>(raw0 + st * kRawBytes<D>); };
  auto raw_v = [&](int st) { return raw_k(st) + kSlice * D; };
  auto raw_s = [&](int st) { return reinterpret_cast<float*>(raw_k(st) + 2 * kSlice * D); };

  // kRuns: this lane's chunks are bytes (it * 32 + lane) * 16 of a slice's run, rows r0 + it * (32 / kCh);
  // where each lands in a slot (kchunk / vchunk swizzles) depends on the lane only: taken once here
  // instead of per slice (session 33's SASS had ~50 address instructions a slice for it).
  [[maybe_unused]] const int r0 = lane / kCh;
  [[maybe_unused]] int k_dst[kPer], v_dst[kPer];
#pragma unroll
  for (int it = 0; it < kPer; ++it) {
    const int i = it * 32 + lane, r = i / kCh, c = i % kCh;
    k_dst[it] = (r * kCh + attn_q8::kchunk<D, 2>(r, c)) * 16;
    v_dst[it] = kSlice * D + (r * kCh + vchunk<D>(r, c)) * 16;
  }
  [[maybe_unused]] const float* const my_scales = lane < 16 ? kv.k_scale : kv.v_scale;

  const StreamWalk<kSlice> walk(kv_len, batch, n_kv_heads, int(gridDim.x) * kWarps);  // a warp is a worker
  StreamCursor rq = walk.start(int64_t(blockIdx.x) * kWarps + warp);  // the next slice to request
  StreamCursor cc = rq;                                               // the next slice to compute

  // Paged: the block ids of this lane's rows of rq's slice (its K/V chunks', then its scale's),
  // fetched one request ahead so the lookups overlap the compute.
  [[maybe_unused]] int32_t blk[kPer + 1] = {};
  auto fetch_ids = [&] {
    if constexpr (kRuns) {
      const int32_t* bt = kv.block_table + int64_t(rq.b) * kv.bt_stride;
      if (rq.b < batch) blk[0] = __ldg(bt + ((rq.tile * kSlice) >> kv.block_shift));
    } else if constexpr (kPaged) {
      if (rq.b < batch) {
        const int p0 = rq.tile * kSlice, n = min(kSlice, rq.len - p0);
        const int32_t* bt = kv.block_table + int64_t(rq.b) * kv.bt_stride;
#pragma unroll
        for (int it = 0; it <= kPer; ++it) {
          const int r = it < kPer ? (it * 32 + lane) / kCh : lane & 15;
          blk[it] = r < n ? __ldg(bt + ((p0 + r) >> kv.block_shift)) : 0;
        }
      }
    }
  };
  // The quantized vector number (kv_layout.h) of row r of rq's slice; `it`: which fetched id.
  auto vector_of = [&](int it, int r) -> int64_t {
    const int pos = rq.tile * kSlice + r;
    if constexpr (kPaged)
      return kv.slot_quant_index((int64_t(blk[it]) << kv.block_shift) | (pos & ((1 << kv.block_shift) - 1)), rq.kvh);
    else
      return kv.quant_index_as<false>(rq.b, pos, rq.kvh);
  };
  auto load_kv = [&](int st) {
    const int n = min(kSlice, rq.len - rq.tile * kSlice);
    if constexpr (kRuns) {
      const int in_block = (rq.tile * kSlice) & ((1 << kv.block_shift) - 1);
      const int64_t base = kv.slot_quant_index((int64_t(blk[0]) << kv.block_shift) | in_block, rq.kvh);
      const uint8_t *kp = kv.k8 + base * D + lane * 16, *vp = kv.v8 + base * D + lane * 16;
      uint8_t* const slot = raw_k(st);
      // Rows past the sequence's end (r >= n) are zero-filled, their addresses still inside the
      // block: no select between two pointers.
#pragma unroll
      for (int it = 0; it < kPer; ++it) {
        const bool ok = r0 + it * (32 / kCh) < n;
        cp_async16(slot + k_dst[it], kp + it * 512, ok);
        cp_async16(slot + v_dst[it], vp + it * 512, ok);
      }
      cp_async4(raw_s(st) + lane, my_scales + base + (lane & 15), (lane & 15) < n);
    } else {
#pragma unroll
      for (int it = 0; it < kPer; ++it) {
        const int i = it * 32 + lane, r = i / kCh, c = i % kCh;
        const bool ok = r < n && c * 16 < d;
        const int64_t off = ok ? vector_of(it, r) * kv.head_dim + c * 16 : 0;
        cp_async16(raw_k(st) + (r * kCh + attn_q8::kchunk<D, 2>(r, c)) * 16, kv.k8 + off, ok);
        cp_async16(raw_v(st) + (r * kCh + vchunk<D>(r, c)) * 16, kv.v8 + off, ok);
      }
      const int r = lane & 15;
      const float* src = lane < 16 ? kv.k_scale : kv.v_scale;
      cp_async4(raw_s(st) + lane, r < n ? src + vector_of(kPer, r) : src, r < n);
    }
  };
  auto load_q = [&](int st, int b, int kvh) { load_pair_q<D>(q_slot(st), q, b, kvh, n_heads, group, d, lane); };
  auto request = [&](int st, bool with_q = true) {  // as the bf16 slice kernel's (attention_decode_walk.cuh)
    stream_request(rq, walk, batch, st, with_q, load_kv, load_q, fetch_ids);
  };

  fetch_ids();
  stream_prologue<kSlots>(rq, batch, request, load_q, [] { __syncwarp(); });

  uint32_t qb[D / 16][2];
  float q_up = 1.0f, m[2], l[2], o[D / 16][4];
  for (int item = 0; cc.b < batch; ++item) {
    cp_async_wait<kSlots - 2>();
    __syncwarp();  // item's slice (and q) landed for every lane; every lane is done with item - 1's slot
    request((item + kSlots - 1) % kSlots);
    const int st = item % kSlots;
    if (cc.tile == 0) {  // a new pair: its q, fresh softmax state
      q_up = load_qt_frags<D>(qb, q_slot(st), group);
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.0f;
#pragma unroll
      for (int n = 0; n < D / 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    }
    const float *sk = raw_s(st), *sv = sk + kSlice;
    const int n_keys = min(kSlice, cc.len - cc.tile * kSlice);
    if (n_keys >= kSlice)
      attend_slice<D, F, false>(qb, q_up, raw_k(st), raw_v(st), sk, sv, n_keys, vote_group, m, l, o, scale_log2);
    else
      attend_slice<D, F, true>(qb, q_up, raw_k(st), raw_v(st), sk, sv, n_keys, vote_group, m, l, o, scale_log2);
    if (cc.tile == cc.n_tiles - 1)  // the pair's last slice: its query heads out
      store_slice_out<D>(o, l, out + (int64_t(cc.b) * n_heads + int64_t(cc.kvh) * group) * d, group, d);
    ++cc.tile;
    walk.settle(cc);
  }
  cp_async_wait<0>();
}

template <int D, bool kPaged, KvQuant F, int kSlots, int kBlocks, bool kRuns = false>
const GroupOccupancy& q8_slices_occupancy() {
  static const GroupOccupancy o =
      measure_group_occupancy(decode_q8_slices_kernel<D, kPaged, F, kSlots, kBlocks, kRuns>, kThreads,
                              [](int g) { return q8_slices_smem_bytes<D, kSlots>(g); });
  return o;
}

// Calls f(D, paged, format, slots, blocks) tags for the instantiation serving these arguments.
template <class Fn>
decltype(auto) with_q8_slices_instance(int head_dim, bool paged, KvQuant quant, int variant, Fn&& f) {
  using Int8 = std::integral_constant<KvQuant, KvQuant::int8>;
  using Fp8 = std::integral_constant<KvQuant, KvQuant::fp8>;
  using S4B2 = std::integral_constant<int, 1>;
  using S3B3 = std::integral_constant<int, 2>;
  if (variant == 0) variant = kQ8SlicesDefaultVariant;
  return with_decode_instance(head_dim, paged, [&](auto dt, auto pt) {
    if (quant == KvQuant::int8) return variant == 1 ? f(dt, pt, Int8{}, S4B2{}) : f(dt, pt, Int8{}, S3B3{});
    return variant == 1 ? f(dt, pt, Fp8{}, S4B2{}) : f(dt, pt, Fp8{}, S3B3{});
  });
}
template <int kVariant>
constexpr int kSlotsOf = kVariant == 1 ? 4 : 3;
template <int kVariant>
constexpr int kBlocksOf = kVariant == 1 ? 2 : 3;

}  // namespace

DecodeSlicesFit decode_q8_slices_fit(KvQuant quant, int n_heads, int n_kv_heads, int head_dim, bool paged, int variant) {
  if (!persistent_decode_applies(n_heads, n_kv_heads, head_dim) || head_dim % 16 != 0) return {};
  const int group = n_heads / n_kv_heads;
  return with_q8_slices_instance(head_dim, paged, quant, variant, [&](auto dt, auto pt, auto ft, auto vt) {
    constexpr int V = decltype(vt)::value;
    const GroupOccupancy& occ = q8_slices_occupancy<decltype(dt)::value, decltype(pt)::value, decltype(ft)::value,
                                                    kSlotsOf<V>, kBlocksOf<V>>();
    return DecodeSlicesFit{occ.per_sm[group], int64_t(occ.sms) * occ.per_sm[group] * kWarps};
  });
}

void attention_decode_q8_slices(const bf16* q, const KvLayout& kv, const int32_t* kv_len, bf16* out, int64_t batch,
                                int n_heads, int n_kv_heads, int head_dim, bool pdl, cudaStream_t stream,
                                int variant) {
  KILN_CUDA_REQUIRE(kv.quantized() && persistent_decode_applies(n_heads, n_kv_heads, head_dim) && head_dim % 16 == 0,
                    "attention: the 8-bit slice decode kernel needs a quantized cache, at most 8 query heads per KV "
                    "head and head_dim % 16 == 0");
  if (batch == 0) return;
  const int group = n_heads / n_kv_heads;
  with_q8_slices_instance(head_dim, kv.paged(), kv.quant, variant, [&](auto dt, auto pt, auto ft, auto vt) {
    constexpr int D = decltype(dt)::value, V = decltype(vt)::value;
    constexpr bool P = decltype(pt)::value;
    constexpr KvQuant F = decltype(ft)::value;
    constexpr int S = kSlotsOf<V>, B = kBlocksOf<V>;
    const float scale_log2 = attn::kLog2e / sqrtf(float(head_dim));
    // The comparisons, each the same bits: KILN_ATTN_Q8_RUNS=0 the per-row addressing everywhere,
    // KILN_ATTN_Q8_LAZY_RESCALE=0 the rescale in every slice (attention_q8_slice_tile.cuh).
    static const bool runs_on = env_switch_on("KILN_ATTN_Q8_RUNS");
    static const bool lazy_on = env_switch_on("KILN_ATTN_Q8_LAZY_RESCALE");
    auto launch = [&](auto runs) {
      constexpr bool R = decltype(runs)::value;
      const GroupOccupancy& occ = q8_slices_occupancy<D, P, F, S, B, R>();
      const int64_t pairs = batch * n_kv_heads;
      const int64_t blocks =
          std::min<int64_t>((pairs + kWarps - 1) / kWarps, int64_t(occ.sms) * std::max(1, occ.per_sm[group]));
      launch_maybe_pdl(pdl, decode_q8_slices_kernel<D, P, F, S, B, R>, dim3(unsigned(blocks)), dim3(kThreads),
                       q8_slices_smem_bytes<D, S>(group), stream, q, kv, kv_len, out, n_heads, n_kv_heads, group,
                       head_dim, int(batch), scale_log2, lazy_on ? group : 0);
    };
    if constexpr (P) {
      if (runs_on && kv.block_shift >= 4 && head_dim == D) {
        launch(std::true_type{});
        KILN_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    launch(std::false_type{});
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::cuda
