// Causal prefill attention, tiled fp32 flash attention (the correct baseline; an mma.sync version
// is the next step). Block = 4 warps = 32 query rows of one query head; K/V tiles of 32 positions
// are converted to fp32 in shared memory. Lane j scores key j of the tile (K rows padded by one
// float so the 32 lanes hit 32 banks); the online softmax runs per row in registers; for P.V lane l
// owns output dims l, l+32, l+64, l+96.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/epilogue.cuh"

namespace kiln::cuda {
namespace {

constexpr int kTileQ = 32, kTileK = 32, kWarps = 4, kRowsPerWarp = kTileQ / kWarps;
constexpr int kDimsPerLane = kAttnMaxHeadDim / 32;

__global__ void __launch_bounds__(kWarps * 32)
    prefill_kernel(const bf16* __restrict__ q, KvLayout kv, bf16* __restrict__ out, int64_t n_q, int64_t q_start,
                   int n_heads, int group, int d, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;                 // (kTileQ, d)
  float* ks = qs + kTileQ * d;      // (kTileK, d + 1)
  float* vs = ks + kTileK * (d + 1);  // (kTileK, d)
  const int h = blockIdx.y, kvh = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q0 = int64_t(blockIdx.x) * kTileQ;
  const int64_t rows = imin64(kTileQ, n_q - q0);

  for (int i = threadIdx.x; i < kTileQ * d; i += blockDim.x) {
    int r = i / d, c = i % d;
    qs[i] = r < rows ? __bfloat162float(q[((q0 + r) * n_heads + h) * d + c]) * scale : 0.0f;
  }

  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) o[i][c] = 0.0f;
  }

  const int64_t n_keys = q_start + q0 + rows;  // the last row of the tile sees this many keys
  for (int64_t k0 = 0; k0 < n_keys; k0 += kTileK) {
    __syncthreads();  // the previous tile is consumed (and qs is written, the first time)
    for (int i = threadIdx.x; i < kTileK * d; i += blockDim.x) {
      int r = i / d, c = i % d;
      int64_t pos = k0 + r;
      bool ok = pos < n_keys;
      int64_t off = kv.offset(0, ok ? pos : 0, kvh) + c;
      ks[r * (d + 1) + c] = ok ? __bfloat162float(kv.k[off]) : 0.0f;
      vs[r * d + c] = ok ? __bfloat162float(kv.v[off]) : 0.0f;
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp * kRowsPerWarp + i;
      if (r >= rows) continue;  // uniform over the warp
      const int64_t q_pos = q_start + q0 + r, k_pos = k0 + lane;
      if (k0 > q_pos) continue;  // the whole tile is in this row's future
      float s = -INFINITY;
      if (k_pos <= q_pos) {
        s = 0.0f;
        const float* qr = qs + r * d;
        const float* kr = ks + lane * (d + 1);
        for (int c = 0; c < d; ++c) s = fmaf(qr[c], kr[c], s);
      }
      float tile_max = s;
      for (int off = 16; off > 0; off >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      const float m_new = fmaxf(m[i], tile_max);  // finite: key k0 <= q_pos is visible
      const float p = __expf(s - m_new), corr = __expf(m[i] - m_new);
      float p_sum = p;
      for (int off = 16; off > 0; off >>= 1) p_sum += __shfl_xor_sync(0xffffffffu, p_sum, off);
      l[i] = l[i] * corr + p_sum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < kDimsPerLane; ++c) o[i][c] *= corr;
      for (int j = 0; j < kTileK; ++j) {
        float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int c = 0; c < kDimsPerLane; ++c) {
          int dim = lane + 32 * c;
          if (dim < d) o[i][c] = fmaf(pj, vs[j * d + dim], o[i][c]);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    if (r >= rows) continue;
    bf16* orow = out + ((q0 + r) * n_heads + h) * d;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      int dim = lane + 32 * c;
      if (dim < d) orow[dim] = __float2bfloat16(o[i][c] / l[i]);
    }
  }
}

}  // namespace

void attention_prefill(const bf16* q, KvLayout kv, bf16* out, int64_t n_q, int64_t q_start, int n_heads,
                       int n_kv_heads, int head_dim, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(head_dim % 8 == 0 && head_dim <= kAttnMaxHeadDim, "attention: head_dim must be a multiple of 8, <= 128");
  KILN_CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  if (n_q == 0) return;
  size_t smem = size_t(kTileQ * head_dim + kTileK * (head_dim + 1) + kTileK * head_dim) * sizeof(float);
  static bool configured = false;
  if (!configured) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int((3 * kTileQ * kAttnMaxHeadDim + kTileK) * sizeof(float))));
    configured = true;
  }
  dim3 grid(unsigned((n_q + kTileQ - 1) / kTileQ), unsigned(n_heads));
  prefill_kernel<<<grid, kWarps * 32, smem, stream>>>(q, kv, out, n_q, q_start, n_heads, n_heads / n_kv_heads,
                                                      head_dim, 1.0f / sqrtf(float(head_dim)));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
