// Decode GEMV: y(M, N) = x(M, K) . W(N, K)^T for M <= 16.
//
// Memory-bound on W (N*K*2 bytes; x and y are tiny). Each warp owns kRowsPerWarp = 2 weight rows
// and walks K in 16-byte chunks (8 bf16), lane-strided so a warp reads 512 contiguous bytes of a
// row per step; U chunks per row are loaded before any is used, so 2*U 16-byte loads are in flight
// per lane. x chunks come through L1 (every warp of the SM reads the same x), and each x chunk is
// reused for both rows. fp32 accumulation, one warp reduction at the end.
// Instantiations: M in {1, 2, 4, 8, 16}; a run-time m_actual <= M masks the extra rows.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/matmul.h"

namespace kiln::cuda {
namespace {

constexpr int kRowsPerWarp = 2;
constexpr int kWarps = 8;

template <int M>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                           const bf16* __restrict__ bias, void* __restrict__ y,
                                                           OutMode mode, int m_actual, int64_t N, int64_t K) {
  constexpr int U = M <= 4 ? 4 : 2;  // chunks in flight per row; fewer when M makes registers dear
  const int lane = threadIdx.x % 32;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * kRowsPerWarp;
  if (row0 >= N) return;
  const bool has_row1 = row0 + 1 < N;
  const bf16* w0 = w + row0 * K;                   // (K)
  const bf16* w1 = has_row1 ? w0 + K : w0;         // (K); a duplicate of row 0 past the end

  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

  if ((K & 7) == 0) {
    const int64_t n_chunks = K / 8;
    const uint4* w0v = reinterpret_cast<const uint4*>(w0);
    const uint4* w1v = reinterpret_cast<const uint4*>(w1);
    for (int64_t base = lane; base < n_chunks; base += 32 * U) {
      uint4 wa[U], wb[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {  // all W loads first: they are what the kernel waits on
        int64_t c = base + 32 * u;
        if (c < n_chunks) {
          wa[u] = __ldcs(w0v + c);  // streamed once: do not keep in L1/L2 at the expense of x
          wb[u] = __ldcs(w1v + c);
        } else {
          wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int64_t c = base + 32 * u;
        if (c >= n_chunks) break;
        float fa[8], fb[8];
        unpack8(wa[u], fa);
        unpack8(wb[u], fb);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          if (m < m_actual) {
            float fx[8];
            unpack8(__ldg(reinterpret_cast<const uint4*>(x + m * K) + c), fx);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              acc[0][m] = fmaf(fa[i], fx[i], acc[0][m]);
              acc[1][m] = fmaf(fb[i], fx[i], acc[1][m]);
            }
          }
        }
      }
    }
  } else {  // K not a multiple of 8: scalar loads (tests only)
    for (int64_t k = lane; k < K; k += 32) {
      float a = __bfloat162float(w0[k]), b = __bfloat162float(w1[k]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m < m_actual) {
          float xv = __bfloat162float(x[m * K + k]);
          acc[0][m] = fmaf(a, xv, acc[0][m]);
          acc[1][m] = fmaf(b, xv, acc[1][m]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);

  // Lane r*M + m writes (m, row0 + r): spreads the stores over the warp.
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (lane == (r * M + m) % 32 && m < m_actual && (r == 0 || has_row1)) {
        int64_t n = row0 + r;
        float v = acc[r][m] + (bias ? __bfloat162float(bias[n]) : 0.0f);
        store_out(y, mode, int64_t(m) * N + n, v);
      }
    }
  }
}

template <int M>
void launch(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int m_actual, int64_t N, int64_t K,
            cudaStream_t stream) {
  int64_t rows_per_block = kWarps * kRowsPerWarp;
  unsigned blocks = unsigned((N + rows_per_block - 1) / rows_per_block);
  gemv_kernel<M><<<blocks, kWarps * 32, 0, stream>>>(x, w, bias, y, mode, m_actual, N, K);
}

}  // namespace

void gemv(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
          cudaStream_t stream) {
  KILN_CUDA_REQUIRE(M >= 1 && M <= kGemvMaxRows, "gemv takes 1..16 rows");
  if (N == 0) return;
  int m = int(M);
  if (m == 1)
    launch<1>(x, w, bias, y, mode, m, N, K, stream);
  else if (m == 2)
    launch<2>(x, w, bias, y, mode, m, N, K, stream);
  else if (m <= 4)
    launch<4>(x, w, bias, y, mode, m, N, K, stream);
  else if (m <= 8)
    launch<8>(x, w, bias, y, mode, m, N, K, stream);
  else
    launch<16>(x, w, bias, y, mode, m, N, K, stream);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
