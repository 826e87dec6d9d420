// The decode megakernel's inner product: one consumer warp's super-chunk (64 bytes of each of a
// tile's 16 rows) against x, both in shared memory, for each weight format (also the fused
// attention + o kernel's, attention_o_fused.cu, from its own shared-memory layout). The operand forms and
// the folds are qgemv v3's (quant/qgemv_v3_parts.cuh) and the bf16 GEMV's: the same MMAs, fed from
// the ring slot instead of registers.
//
// A ring slot holds 16 rows (slot row g + 8 h = the tile's row run h, lane quad g) of 2048 bytes
// each, kSlotRowStride apart (the 64-byte pad puts rows g and g + 1 on different banks for the
// quads' 16-byte loads), then for int4 each row's 32 {scale, min'} pairs, kSlotScaleStride apart.
// Consumer warp w takes super-chunks 4w .. 4w + 3 of the slot; lane (g, t) reads its 16-byte piece t
// of rows g and g + 8 (one conflict-free LDS.128 each). x is staged once a phase as bf16 (int8: fp16(x / 16),
// qgemv v3's form for its fp16 MMAs) with one sum per super-chunk (int8 / int4: the min' term).
// With M = 1 every lane's B operand is x itself, so every column of the 16x8 result holds the same
// dot products: c0 / c2 of any lane are rows g / g + 8.
#pragma once

#include "kernels/cuda/quant/qgemv_v3_parts.cuh"

namespace kiln::cuda::mk {

// A slot: 2048 bytes of each of 16 rows, 4 super-chunks for each of the 8 consumer warps. Slots of
// 512 bytes a row (one super-chunk a warp) cost a warp ~700 cycles each in its serial chain of ring
// wait, address math, loads, MMAs and release, so a block could not consume 18 bytes a cycle
// (session 19 run 9's in-kernel breakdown); four independent super-chunks a turn amortize the
// chain and give the warp's loads and MMAs something to overlap.
constexpr int kSlotRowBytes = 2048;                     // weight bytes of one row per slot
constexpr int kSlotRowStride = kSlotRowBytes + 64;      // 528 words: rows g and g + 1 on other banks
constexpr int kSlotScaleStride = 272;                   // int4: 32 float2 per row (256 B), padded (68 words)
constexpr int kSlotSuperChunks = kSlotRowBytes / 64;    // 32
constexpr int kWarpSuperChunks = 4;                     // per consumer warp and slot

// k per 64-byte super-chunk of a row: bf16 32, int8 64, int4 128.
template <QuantFormat F>
constexpr int kSuperK = F == QuantFormat::int4 ? 128 : F == QuantFormat::int8 ? 64 : 32;
// Bytes of one weight row per k (x2: int4 packs two a byte).
template <QuantFormat F>
constexpr int kBytesPer2K = F == QuantFormat::int4 ? 1 : F == QuantFormat::int8 ? 2 : 4;
template <QuantFormat F>
constexpr int kSlotBytes = 16 * kSlotRowStride + (F == QuantFormat::int4 ? 16 * kSlotScaleStride : 0);
// int8 stages x as fp16(x / 16) (qgemv_v3_parts.cuh's kF16XScale); its products come back x16.
template <QuantFormat F>
constexpr float kResultScale = F == QuantFormat::int8 ? 1.0f / kF16XScale : 1.0f;

// acc += this super-chunk's products. a_lo / a_hi: shared addresses of lane (g, t)'s 16-byte pieces
// of rows g / g + 8; xp: of x at this lane's first k (x_base + 2 (k0 + 8 t)); xsum: the sum of the
// super-chunk's x; s_lo / s_hi: int4 the super-chunk's {scale, min'} of rows g / g + 8, int8 the
// rows' (per channel), bf16 unused.
template <QuantFormat F>
__device__ __forceinline__ void superchunk(float (&acc)[4], uint32_t a_lo, uint32_t a_hi, uint32_t xp, float xsum,
                                           float2 s_lo, float2 s_hi) {
  const uint4 wl4 = lds128(a_lo), wh4 = lds128(a_hi);
  if constexpr (F == QuantFormat::none) {
    // Lane t's piece is k 8t .. 8t + 7 of the 32: words 0 / 1 pair with x's words 0 / 1 in one MMA
    // (the MMA's k slots 2t / 2t + 8), words 2 / 3 in a second.
    const uint4 b = lds128(xp);
    qk::mma_bf16(acc, wl4.x, wh4.x, wl4.y, wh4.y, b.x, b.y);
    qk::mma_bf16(acc, wl4.z, wh4.z, wl4.w, wh4.w, b.z, b.w);
  } else if constexpr (F == QuantFormat::int4) {
    uint4 b[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = lds128(xp + 64 * j);  // x at k0 + 32 j + 8 t
    float q[2][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // word j: 32-wide group j of the super-chunk
      const uint32_t wl = qk::word(wl4, j), wh = qk::word(wh4, j);
      const uint32_t l0 = pair<0, 0x43004300u>(wl), l1 = pair<4, 0x43004300u>(wl), l2 = pair<8, 0x43004300u>(wl),
                     l3 = pair<12, 0x43004300u>(wl);
      const uint32_t h0 = pair<0, 0x43004300u>(wh), h1 = pair<4, 0x43004300u>(wh), h2 = pair<8, 0x43004300u>(wh),
                     h3 = pair<12, 0x43004300u>(wh);
      if (j == 0) {
        mma_acc<true>(q[0], l0, h0, l1, h1, b[j].x, b[j].y);
        mma_acc<true>(q[1], l2, h2, l3, h3, b[j].z, b[j].w);
      } else {
        mma_acc<false>(q[0], l0, h0, l1, h1, b[j].x, b[j].y);
        mma_acc<false>(q[1], l2, h2, l3, h3, b[j].z, b[j].w);
      }
    }
    float qs[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) qs[e] = q[0][e] + q[1][e];
    fold4(acc, qs, s_lo, s_hi, make_float2(xsum, xsum));
  } else {
    // int8: bytes as fp16 pairs (1024 + u) against fp16(x / 16), one MMA per word pair; min' shifted
    // as qgemv v3 shifts it (its offset is 2176 + u on the nibble path).
    uint4 b[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) b[h] = lds128(xp + 64 * h);
    float q[4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const uint32_t wl = qk::word(wl4, 2 * h + jj), wh = qk::word(wh4, 2 * h + jj);
        const uint32_t p02 = byte_pair_f16<0x4240u>(wl), p13 = byte_pair_f16<0x4341u>(wl);
        const uint32_t p02h = byte_pair_f16<0x4240u>(wh), p13h = byte_pair_f16<0x4341u>(wh);
        const uint32_t b0 = jj == 0 ? b[h].x : b[h].z, b1 = jj == 0 ? b[h].y : b[h].w;
        if (h == 0 && jj == 0)
          mma_acc<true, true>(q, p02, p02h, p13, p13h, b0, b1);
        else
          mma_acc<false, true>(q, p02, p02h, p13, p13h, b0, b1);
      }
    const float2 fl = make_float2(s_lo.x, fmaf(1152.0f, s_lo.x, s_lo.y));
    const float2 fh = make_float2(s_hi.x, fmaf(1152.0f, s_hi.x, s_hi.y));
    fold4(acc, q, fl, fh, make_float2(xsum, xsum));
  }
}

}  // namespace kiln::cuda::mk
