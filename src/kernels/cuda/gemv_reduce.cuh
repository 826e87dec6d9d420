// The end shared by the tensor-core GEMVs (gemv.cu v2, quant/qgemv.cu, quant/fp8_gemv.cu): W warps
// each hold, in mma.sync m16n8k16 accumulator layout, partial sums of the block's 16 weight rows
// for 8 * NT activation rows; they meet in shared memory and one thread per output finishes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

// Accumulator e of n-tile j of lane (g, t) = (lane / 4, lane % 4): weight row g + 8 (e / 2),
// activation row 8j + 2t + e % 2. Writes this warp's partials into red[warp].
template <int W, int NT>
__device__ __forceinline__ void gemv_stash(float (&red)[W][16][8 * NT + 1], int warp, int g, int t,
                                           const float (&acc)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp][g + 8 * (e >> 1)][8 * j + 2 * t + (e & 1)] = acc[j][e];
}

// After every warp's gemv_stash: thread i sums (weight row i % 16, activation row i / 16) over the
// warps in warp order onto start(n), consecutive threads taking consecutive n, and calls
// finish(m, n, sum) for the outputs inside (m_actual, N). warps: the block's warps (<= W, the
// array's; qgemv v3 picks 4 or 8 at run time).
template <int W, int NT, class Start, class Finish>
__device__ __forceinline__ void gemv_meet(const float (&red)[W][16][8 * NT + 1], int64_t row0, int m_actual,
                                          int64_t N, Start&& start, Finish&& finish, int warps = W) {
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * 8 * NT; i += warps * 32) {
    const int r = i % 16, m = i / 16;
    const int64_t n = row0 + r;
    if (m >= m_actual || n >= N) continue;
    float v = start(n);
#pragma unroll
    for (int q = 0; q < W; ++q)
      if (q < warps) v += red[q][r][m];
    finish(m, n, v);
  }
}

}  // namespace kiln::cuda
