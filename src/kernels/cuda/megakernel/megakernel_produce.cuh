// The decode megakernel's producer warps: every weight chunk the block will multiply, layer after
// layer, in the consumers' order, into the ring (megakernel_sync.cuh's protocol).
#pragma once

#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/megakernel/megakernel_plan.cuh"
#include "kernels/cuda/megakernel/megakernel_sync.cuh"

namespace kiln::cuda::mk {

// Producer warp pw of kProducerWarps. cp.async (the default): warp pw copies items i with
// i % kProducerWarps == pw, 16 bytes a lane, each lane arming the slot's `full` barrier (count 32)
// with cp.async.mbarrier.arrive.noinc. p.tma (KILN_MEGAKERNEL_TMA=1, for comparison): warp 0 alone
// has the TMA unit copy each row's chunk (one bulk copy a row) and arms `full` (count 1) with the
// slot's bytes. With 512-byte chunks that streamed ~1 TB/s (megakernel.md, session 19 run 4); with
// 2048-byte chunks it is within 6% of cp.async (run 12: bf16 +6%, int8 +2%, int4 -3%).
template <QuantFormat F>
__device__ void produce(const Params& p, unsigned char* ring, uint64_t* full, uint64_t* empty, int pw) {
  if (p.tma && pw != 0) return;
  const int lane = int(threadIdx.x % 32);
  // With a trace: the time this block's producer warp 0 waited for a free slot, per layer.
  uint64_t* trace = p.st.trace && pw == 0 ? p.st.trace + trace_producer_offset(p.m.n_layers, blockIdx.x) : nullptr;
  uint64_t stalled = 0;
  uint32_t item = 0;
  for (int l = 0; l < p.m.n_layers; ++l) {
    const MegakernelLayer& L = p.m.layers[l];
    for (int mi = 0; mi < 4; ++mi) {
      const Dims d = dims_of(p.m, mi);
      const int64_t row_bytes = row_bytes_of<F>(d.cols);
      const int chunks = int((row_bytes + kSlotRowBytes - 1) / kSlotRowBytes);
      const unsigned char* w = static_cast<const unsigned char*>(L.w[mi]);
      const unsigned char* sc = reinterpret_cast<const unsigned char*>(L.scales[mi]);
      const int64_t scale_row_bytes = d.cols / 128 * 8;  // int4: one float2 per 128 columns
      const TileRange tr = tiles_of(d.rows / 16, l, mi);
      for (int t = tr.t0; t < tr.t0 + tr.n; ++t) {
        int64_t lo0, hi0;
        runs_of(p.m, mi, t, lo0, hi0);
        for (int c = 0; c < chunks; ++c, ++item) {
          if (!p.tma && int(item % kProducerWarps) != pw) continue;
          const uint32_t slot = item % uint32_t(p.slots), use = item / uint32_t(p.slots);
          if (use > 0) {
            const uint64_t t0 = trace ? clock64() : 0;
            mbar_wait_warp(&empty[slot], (use - 1) & 1);
            if (trace) stalled += clock64() - t0;
          }
          unsigned char* dst = ring + size_t(slot) * kSlotBytes<F>;
          const int64_t at = int64_t(c) * kSlotRowBytes;
          const uint32_t vb = uint32_t(imin64(int64_t(kSlotRowBytes), row_bytes - at));  // a multiple of 64
          if (p.tma) {
            // Lane r < 16 copies row r's chunk, lane 16 + r (int4) its scales: 8 bytes per 64 of weights.
            const uint32_t bytes = 16 * vb + (F == QuantFormat::int4 ? 16 * (vb / 8) : 0);
            if (lane == 0) mbar_arrive_expect_tx(&full[slot], bytes);
            __syncwarp();
            const int r = lane % 16;
            const int64_t row = tile_row(lo0, hi0, r);
            if (lane < 16)
              bulk_copy(dst + r * kSlotRowStride, w + row * row_bytes + at, vb, &full[slot]);
            else if (F == QuantFormat::int4)
              bulk_copy(dst + 16 * kSlotRowStride + r * kSlotScaleStride, sc + row * scale_row_bytes + at / 8, vb / 8,
                        &full[slot]);
            continue;
          }
          if (p.probe != 2) {
            for (int r = 0; r < 16; ++r) {
              const int64_t row = tile_row(lo0, hi0, r);
              const unsigned char* src = w + row * row_bytes + at;
#pragma unroll 4
              for (int i = 16 * lane; i < int(vb); i += 512) cp_async16(dst + r * kSlotRowStride + i, src + i);
            }
            if constexpr (F == QuantFormat::int4) {
              const int sb = int(vb) / 8;  // the chunk's scale bytes per row: 8 per 64-byte super-chunk
              for (int i = lane; i < 16 * (kSlotRowBytes / 128); i += 32) {  // 16 rows x 16 pieces of 16 bytes
                const int r = i / (kSlotRowBytes / 128), piece = i % (kSlotRowBytes / 128);
                if (16 * piece < sb) {
                  const int64_t row = tile_row(lo0, hi0, r);
                  cp_async16(dst + 16 * kSlotRowStride + r * kSlotScaleStride + 16 * piece,
                             sc + row * scale_row_bytes + at / 8 + 16 * piece);
                }
              }
            }
          }
          cp_async_arrive(&full[slot]);
        }
      }
    }
    if (trace && lane == 0) trace[l] = stalled;
    stalled = 0;
  }
  if (!p.tma) cp_async_wait_all();
}

}  // namespace kiln::cuda::mk
