// kiln::cpu::matmul: y = x * w^T with a register-blocked micro-kernel.
//
// Summation order (the same for every output, whatever m is or how rows are blocked, so a row's
// result never depends on which other rows share the product: the CPU's batched and
// single-sequence paths stay bit-identical): four partial sums, lane l taking the elements
// i = l mod 4 of each whole group of four, reduced as (0+1)+(2+3), then the tail in order. (Until
// the quantization work this was one plain dot per output with eight partial sums; the change of
// order moves results by a few fp32 ulps.)
//
// The speed comes from reuse: a 3x4 block (three activation rows x four weight rows) keeps its
// twelve 4-lane sums in SSE registers and loads each 4-float slice of x and w once for three or
// four products, and activation rows are walked in L2-sized tiles so x comes from cache while each
// weight quad is reused across the tile. Plain SSE2 (the x86-64 baseline), no -ffast-math, no FMA:
// GCC's vector extensions give exactly the scalar arithmetic.
#include <algorithm>
#include <cstring>

#include "backend/cpu/ops.h"

namespace kiln::cpu {
namespace {

typedef float v4 __attribute__((vector_size(16)));

inline v4 load4(const float* p) {
  v4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

constexpr int kRows = 3, kCols = 4;  // activation rows x weight rows per block

// y[r][c] = x[r] . w[c] (+ bias[c]) for r < MR, c < NR.
template <int MR, int NR>
void block(const float* x, const float* w, const float* bias, float* y, int64_t n, int64_t k) {
  v4 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = v4{0, 0, 0, 0};
  int64_t p = 0;
  for (; p + 4 <= k; p += 4) {
    v4 xv[MR];
    for (int r = 0; r < MR; ++r) xv[r] = load4(x + r * k + p);
    for (int c = 0; c < NR; ++c) {
      const v4 wv = load4(w + c * k + p);
      for (int r = 0; r < MR; ++r) acc[r][c] += xv[r] * wv;
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) {
      float sum = (acc[r][c][0] + acc[r][c][1]) + (acc[r][c][2] + acc[r][c][3]);
      for (int64_t t = p; t < k; ++t) sum += x[r * k + t] * w[c * k + t];
      y[r * n + c] = sum + (bias ? bias[c] : 0.0f);
    }
}

// Dispatches a block of mr (1..3) x nr (1..4) to its instantiation.
template <int MR>
void block_rows(int nr, const float* x, const float* w, const float* bias, float* y, int64_t n, int64_t k) {
  switch (nr) {
    case 4: block<MR, 4>(x, w, bias, y, n, k); return;
    case 3: block<MR, 3>(x, w, bias, y, n, k); return;
    case 2: block<MR, 2>(x, w, bias, y, n, k); return;
    default: block<MR, 1>(x, w, bias, y, n, k); return;
  }
}

}  // namespace

void matmul(ThreadPool& pool, const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k) {
  // Activation rows per tile: about 96 KiB of x, so a tile stays in L2 while every weight quad of
  // this thread's share streams past it; a multiple of the block's rows.
  const int64_t tile = std::max<int64_t>(1, int64_t(96 << 10) / std::max<int64_t>(k * 4 * kRows, 1)) * kRows;
  pool.parallel_for((n + kCols - 1) / kCols, [&](int64_t q0, int64_t q1) {
    const int64_t j0 = q0 * kCols, j1 = std::min(q1 * kCols, n);
    for (int64_t i0 = 0; i0 < m; i0 += tile) {
      const int64_t i1 = std::min(i0 + tile, m);
      for (int64_t j = j0; j < j1; j += kCols) {
        const int nr = int(std::min<int64_t>(kCols, j1 - j));
        const float* wj = w + j * k;
        const float* bj = bias ? bias + j : nullptr;
        for (int64_t i = i0; i < i1; i += kRows) {
          const float* xi = x + i * k;
          float* yij = y + i * n + j;
          switch (std::min<int64_t>(kRows, i1 - i)) {
            case 3: block_rows<3>(nr, xi, wj, bj, yij, n, k); break;
            case 2: block_rows<2>(nr, xi, wj, bj, yij, n, k); break;
            default: block_rows<1>(nr, xi, wj, bj, yij, n, k); break;
          }
        }
      }
    }
  });
}

}  // namespace kiln::cpu
