// The greedy head's epilogue (gemm_wgmma_persistent.cu, config PCfgCo256Argmax; session 34): a
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
template <int BN>
__device__ __forceinline__ void argmax_acc_block(const float* d, int tid, int64_t row0, int64_t n0, int tile,
                                                 int tiles_per_row, int64_t M, int64_t N, float2* parts) {
  const int w = tid / 32, l = tid % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float bv = NAN;
    int bi = kArgmaxNoIndex;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = n0 + j * 8 + 2 * (l % 4) + e;
        const float v = d[4 * j + 2 * h + e];
        if (col < N && argmax_better(v, int(col), bv, bi)) bv = v, bi = int(col);
      }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {  // the quad's lanes hold the row's other columns
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (argmax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    const int64_t r = row0 + w * 16 + l / 4 + 8 * h;
    if (l % 4 == 0 && r < M) parts[r * tiles_per_row + tile] = make_float2(bv, __int_as_float(bi));
  }
}

}  // namespace kiln::cuda
