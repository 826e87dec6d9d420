// The greedy head's epilogue (gemm_wgmma_persistent_kernel.cuh, PCfgCo256Argmax; session 34): a
// consumer warpgroup's (64, BN) fp32 accumulator block is reduced to one (value, id) pair per row,
// the row's best column of this tile in argmax_order.cuh's order, written to parts[row][tile].
// argmax_parts (sampling.h) then picks each row's best tile. Why: at 2048 decoding rows the head's
// fp32 logits are 1.05 GB written by the GEMM and read again by the argmax kernel (0.36 ms, and the
// register-store epilogue holds the lm_head GEMM at ~678 TFLOP/s against down's ~755 on the H100,
// session 33's profile); the pairs are 8 bytes a row a tile.
#pragma once

#include "kernels/cuda/argmax_order.cuh"
#include "kernels/cuda/common.h"

namespace kiln::cuda {

// d[4j + e] is (row 16w + l/4 + 8(e>>1), col 8j + 2(l%4) + (e&1)) as in store_acc_block (epilogue.cuh):
// a row's BN columns are spread over the 4 lanes of a quad, BN / 4 each.
//
// A whole tile in two passes, ~3 instructions a value: the row's max by fmaxf (which passes over
// NaN, as argmax_better does) over the thread's values and then the quad, then the lowest column
// holding that max. The same pick as argmax_better's scan: NaN never (an all-NaN row keeps no
// index), ties and +-0 to the lowest column, a row of -inf its first -inf. Session 34's first form
// called argmax_better on every value (~15 instructions a value with the 64-bit column and the NaN
// tests): ~2 us a tile with the tensor cores idle, lm_head 680 -> 639 TFLOP/s on an H100. The last
// tile of a row (columns past N, whose zero products must not win) takes that exact scan.
template <int BN>
__device__ __forceinline__ void argmax_acc_block(const float* d, int tid, int64_t row0, int64_t n0, int tile,
                                                 int tiles_per_row, int64_t M, int64_t N, float2* parts) {
  const int w = tid / 32, l = tid % 32;
  const int c0 = int(n0) + 2 * (l % 4);  // this thread's first column (N < 2^31: the host checks)
  const bool whole = n0 + BN <= N;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float bv;
    int bi = kArgmaxNoIndex;
    if (whole) {
      bv = d[2 * h];
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) bv = fmaxf(bv, fmaxf(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]));
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) bv = fmaxf(bv, __shfl_xor_sync(0xffffffffu, bv, off));
      // Highest column first, so the lowest one holding the max is what stays.
#pragma unroll
      for (int j = BN / 8 - 1; j >= 0; --j) {
        bi = d[4 * j + 2 * h + 1] == bv ? c0 + 8 * j + 1 : bi;
        bi = d[4 * j + 2 * h] == bv ? c0 + 8 * j : bi;
      }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) bi = min(bi, __shfl_xor_sync(0xffffffffu, bi, off));
    } else {
      bv = NAN;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = c0 + 8 * j + e;
          const float v = d[4 * j + 2 * h + e];
          if (col < N && argmax_better(v, col, bv, bi)) bv = v, bi = col;
        }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {  // the quad's lanes hold the row's other columns
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (argmax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
    }
    const int64_t r = row0 + w * 16 + l / 4 + 8 * h;
    if (l % 4 == 0 && r < M) parts[r * tiles_per_row + tile] = make_float2(bv, __int_as_float(bi));
  }
}

}  // namespace kiln::cuda
