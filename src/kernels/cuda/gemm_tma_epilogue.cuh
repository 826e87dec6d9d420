// The epilogues of the persistent wgmma GEMM (gemm_wgmma_persistent.cu) that leave through the TMA
// unit: bf16 boxes stored from a staging half (store_block_tma) and fp32 boxes added into the output
// (reduce_add_block_tma), each from one consumer warpgroup's (64, BN) accumulator block, with the
// fp8 configurations' row / column scales folded in (AccScale). Internal to that file: included by
// it alone, after wgmma_ptx.cuh. Named barrier 3 + c is consumer c's (128 threads).
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/wgmma_ptx.cuh"

#ifdef KILN_WGMMA_DEVICE
namespace kiln::cuda::tma_epilogue {

using wgmma_ptx::named_bar_sync;

// The TMA-store epilogue of one consumer's (64, BN) block: bias added, rounded to bf16 and written
// to its (64, BN) staging half as BN / BOX boxes of (64 rows, BOX columns). BOX = 64: rows of 128
// bytes, the 16-byte chunk q of row r at q ^ (r % 8) (the 128B swizzle the tensor map names: the 8
// rows a warp writes per store hit 8 different chunk positions, so no bank conflicts). BOX = 32
// (BN = 224): rows of 64 bytes, chunk q of row r at q ^ ((r / 2) % 4) (the 64B swizzle: rows r and
// r + 1 share a 128-byte line, the four row pairs hit four chunk positions, again 32 banks); then one thread stores
// the boxes with cp.async.bulk.tensor (rows >= M and columns >= N clipped by the TMA unit) and the
// warpgroup moves on without waiting for them. The staging half is reused only after
// cp.async.bulk.wait_group.read 0 (the previous tile's boxes were read out of shared memory).
// FP8 (session 11): the fp8 products' scales, folded into the epilogue's loop (a separate pass over
// the accumulators made the 128x256 reduce-add configuration spill): the value stored is
// acc * sx[h] * ws[col] (+ bias), the thread's rows' activation scales times the column's weight
// scale, in the order fp8_gemm_wgmma.cu's kernel multiplies.
struct AccScale {
  float sx[2] = {1.0f, 1.0f};  // the thread's rows r and r + 8 of its 64-row block
  const float* ws = nullptr;
};
__device__ __forceinline__ AccScale acc_scale(const float* xs, const float* ws, int tid, int64_t row0, int64_t M) {
  AccScale a;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = row0 + (tid / 32) * 16 + (tid % 32) / 4 + 8 * h;
    a.sx[h] = r < M ? xs[r] : 0.0f;
  }
  a.ws = ws;
  return a;
}
// The thread's two columns' weight scales (col, col + 1 < N), for kScale.
template <bool kScale>
__device__ __forceinline__ float2 col_scales(const AccScale& a, int64_t col, int64_t N) {
  if constexpr (!kScale) return make_float2(1.0f, 1.0f);
  return make_float2(col < N ? a.ws[col] : 0.0f, col + 1 < N ? a.ws[col + 1] : 0.0f);
}
template <bool kScale>
__device__ __forceinline__ float scaled(float acc, const AccScale& a, int h, float w) {
  if constexpr (!kScale) return acc;
  return acc * a.sx[h] * w;
}

// The staging half of store_block_tma: the block's bf16 values in the boxes above, readable by the
// warpgroup (and the TMA unit) when it returns. The qkv GEMM's RoPE epilogue reads them from there
// (gemm_rope_epilogue.cuh) instead of storing them.
template <int BN, int BOX, bool kScale = false>
__device__ __forceinline__ void stage_block_bf16(const float* d, int tid, int c, uint32_t sc, int64_t n0,
                                                 const bf16* bias, int64_t N, const AccScale& as = {}) {
  static_assert(BOX == 64 || BOX == 32, "128B- or 64B-swizzled boxes");
  constexpr int kChunks = BOX / 8;                   // 16-byte chunks per staged row
  constexpr uint32_t kBoxBytes = 64 * BOX * 2;       // one (64, BOX) bf16 box
  const int w = tid / 32, l = tid % 32;
  if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  named_bar_sync(3 + c, 128);  // the staging half is free
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int64_t col = n0 + j * 8 + 2 * (l % 4);
    const float b0 = bias && col < N ? __bfloat162float(bias[col]) : 0.0f;
    const float b1 = bias && col + 1 < N ? __bfloat162float(bias[col + 1]) : 0.0f;
    const float2 wsc = col_scales<kScale>(as, col, N);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = w * 16 + l / 4 + 8 * h;  // row within the 64-row half
      const int swz = BOX == 64 ? r % 8 : (r / 2) % 4;
      const uint32_t addr = sc + uint32_t(j / kChunks) * kBoxBytes + uint32_t(r) * (BOX * 2) +
                            uint32_t(((j % kChunks) ^ swz) * 16) + uint32_t(l % 4) * 4;
      // Without a bias the values go out as they are (the SwiGLU epilogue's -0.0 stays -0.0, as in silu_mul).
      const float a0 = scaled<kScale>(d[4 * j + 2 * h], as, h, wsc.x);
      const float a1 = scaled<kScale>(d[4 * j + 2 * h + 1], as, h, wsc.y);
      const float v0 = bias ? a0 + b0 : a0;
      const float v1 = bias ? a1 + b1 : a1;
      const __nv_bfloat162 v = __floats2bfloat162_rn(v0, v1);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<const uint32_t*>(&v)) : "memory");
    }
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // st.shared -> the TMA unit's reads
  named_bar_sync(3 + c, 128);
}

template <int BN, int BOX, bool kScale = false>
__device__ __forceinline__ void store_block_tma(const float* d, int tid, int c, uint32_t sc, const CUtensorMap* map_y,
                                                int64_t row0, int64_t n0, const bf16* bias, int64_t M, int64_t N,
                                                const AccScale& as = {}) {
  constexpr uint32_t kBoxBytes = 64 * BOX * 2;
  stage_block_bf16<BN, BOX, kScale>(d, tid, c, sc, n0, bias, N, as);
  if (tid == 0 && row0 < M) {
#pragma unroll
    for (int b = 0; b < BN / BOX; ++b) {
      if (n0 + b * BOX >= N) break;
      asm volatile(
          "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
              reinterpret_cast<uint64_t>(map_y)),
          "r"(int(n0) + b * BOX), "r"(int(row0)), "r"(sc + uint32_t(b) * kBoxBytes)
          : "memory");
    }
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  }
}
// The TMA reduce-add epilogue of one consumer's (64, BN) block (configs 9 / 10): y(row, col) +=
// d + bias, BN / 32 boxes of (64 rows, 32 fp32 columns), staged in the consumer's two 8 KB buffers
// (sc, sc + 8 KB) in turn. Rows of 128 bytes in the 128B swizzle (the 16-byte chunk q of row r at
// q ^ (r % 8)), so a warp's float2 stores (8 rows x 4 lanes) hit 8 chunk positions. Each box is
// its own bulk group: before a buffer is rewritten, the group that read it two boxes ago (this
// tile's, or the previous tile's last two: BN / 32 is even) must be done reading it
// (cp.async.bulk.wait_group.read 1). One writer per output element, so the result is y + v in one
// fp32 add, as the register epilogue's (the L2's f32 reduction may flush subnormals: the residual
// stream has none in practice).
template <int BN, bool kScale = false>
__device__ __forceinline__ void reduce_add_block_tma(const float* d, int tid, int c, uint32_t sc,
                                                     const CUtensorMap* map_y, int64_t row0, int64_t n0,
                                                     const bf16* bias, int64_t M, int64_t N, const AccScale& as = {}) {
  constexpr int kCols = 32;
  constexpr uint32_t kBoxBytes = 64 * kCols * 4;
  const int w = tid / 32, l = tid % 32;
#pragma unroll
  for (int b = 0; b < BN / kCols; ++b) {
    const uint32_t buf = sc + uint32_t(b & 1) * kBoxBytes;
    if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
    named_bar_sync(3 + c, 128);  // buffer b & 1 is free
#pragma unroll
    for (int jj = 0; jj < kCols / 8; ++jj) {
      const int j = b * (kCols / 8) + jj;  // the accumulators' 8-column group
      const int64_t col = n0 + j * 8 + 2 * (l % 4);
      const float b0 = bias && col < N ? __bfloat162float(bias[col]) : 0.0f;
      const float b1 = bias && col + 1 < N ? __bfloat162float(bias[col + 1]) : 0.0f;
      const float2 wsc = col_scales<kScale>(as, col, N);
      const int q = 2 * jj + (l % 4) / 2;  // 16-byte chunk of the 128-byte row
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = w * 16 + l / 4 + 8 * h;
        const uint32_t addr = buf + uint32_t(r) * 128 + uint32_t((q ^ (r % 8)) * 16) + uint32_t(l % 2) * 8;
        const float v0 = scaled<kScale>(d[4 * j + 2 * h], as, h, wsc.x) + b0;  // as the register add
        const float v1 = scaled<kScale>(d[4 * j + 2 * h + 1], as, h, wsc.y) + b1;
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(v0), "f"(v1) : "memory");
      }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // st.shared -> the TMA unit's reads
    named_bar_sync(3 + c, 128);
    if (tid == 0) {
      if (row0 < M && n0 + b * kCols < N)
        asm volatile(
            "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                reinterpret_cast<uint64_t>(map_y)),
            "r"(int(n0) + b * kCols), "r"(int(row0)), "r"(buf)
            : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");  // one group a box, empty or not
    }
  }
}
// FP8 with SWIGLU: one consumer's (64, BN) accumulator block times its rows' and columns' scales
// before silu (the other epilogues fold the scales into their loops: AccScale above), in the order
// the unfused fp8 kernel multiplies (acc * scale_x * scale_w). W row n's scale is ws[n]; the
// thread's columns j < BN / 16 are gate rows n0 + .. and the rest up rows n_rows / 2 + n0 + ..
// (n_rows = 2I). Rows >= M and W rows >= n_rows get 0 (their outputs are clipped by the stores).
template <int BN>
__device__ __forceinline__ void scale_acc_fp8_swiglu(float* d, int tid, int64_t row0, int64_t n0, const float* xs,
                                                     const float* ws, int64_t M, int64_t n_rows) {
  const AccScale a = acc_scale(xs, ws, tid, row0, M);
  const int l = tid % 32;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    constexpr int kHalf = BN / 16;  // the gate columns' 8-column groups
    const int64_t wrow = (j < kHalf ? n0 + 8 * j : n_rows / 2 + n0 + 8 * (j - kHalf)) + 2 * (l % 4);
    const float2 w = col_scales<true>(a, wrow, n_rows);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[4 * j + 2 * h] = scaled<true>(d[4 * j + 2 * h], a, h, w.x);
      d[4 * j + 2 * h + 1] = scaled<true>(d[4 * j + 2 * h + 1], a, h, w.y);
    }
  }
}

}  // namespace kiln::cuda::tma_epilogue
#endif  // KILN_WGMMA_DEVICE
