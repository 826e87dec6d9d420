// The register epilogue of the wgmma GEMMs (gemm_wgmma.cu, gemm_wgmma_persistent.cu,
// gemm_wgmma_cluster.cu) with the
// add_f32 mode's reads batched. store_acc_block (epilogue.cuh) reads each float2 of y just before
// writing it, and since y may alias anything the compiler keeps every read behind the previous
// write: 2 * BN / 8 dependent round trips to L2/DRAM per thread per 64-row block. The o and down
// products add into the fp32 residual that way: o ran at 444 TFLOP/s in the pp2048 profile against
// 706 for the same GEMM storing bf16 in the kernel lab, down at 666 against 810. Here kBatch column
// groups are read first, then written: BN / 8 / kBatch round trips for 4 * kBatch more registers.
// Same sums in the same order: bit-identical results.
#pragma once


#include "core/env.h"
#include "kernels/cuda/epilogue.cuh"

namespace kiln::cuda {

// For same-run comparison only: KILN_GEMM_ADD_BATCHED=0 makes the wgmma GEMMs' host entry points
// pass add_f32 as this value, which store_acc_block_batched leaves to the general loop, and which
// store_out / store_out2 treat as add_f32 (any mode other than store_bf16 and store_f32 adds).
constexpr OutMode kAddF32Serial = OutMode(3);
inline OutMode wgmma_epilogue_mode(OutMode mode) {
  static const bool batched = env_switch_on("KILN_GEMM_ADD_BATCHED");
  return mode == OutMode::add_f32 && !batched ? kAddF32Serial : mode;
}

template <int BN>
__device__ __forceinline__ void store_acc_block_batched(const float* d, int tid, int64_t row0, int64_t n0,
                                                        const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N) {
  constexpr int kBatch = 4;
  static_assert(BN % (8 * kBatch) == 0, "whole batches");
  // Only whole 64 x BN blocks with even N; edge blocks and the other modes take the general loop.
  if (mode != OutMode::add_f32 || (N & 1) != 0 || n0 + BN > N || row0 + 64 > M) {
    store_acc_block<BN>(d, tid, row0, n0, bias, y, mode, M, N);
    return;
  }
  const int w = tid / 32, l = tid % 32;
  const int64_t r_base = row0 + w * 16 + l / 4;
  float* yf = static_cast<float*>(y);
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += kBatch) {
    float2 old[kBatch][2];  // (column group, row half): y before the add
#pragma unroll
    for (int jj = 0; jj < kBatch; ++jj)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        old[jj][h] = *reinterpret_cast<const float2*>(yf + (r_base + 8 * h) * N + n0 + (j0 + jj) * 8 + 2 * (l % 4));
#pragma unroll
    for (int jj = 0; jj < kBatch; ++jj) {
      const int j = j0 + jj;
      const int64_t col = n0 + j * 8 + 2 * (l % 4);
      const float b0 = bias ? __bfloat162float(bias[col]) : 0.0f, b1 = bias ? __bfloat162float(bias[col + 1]) : 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v0 = d[4 * j + 2 * h] + b0, v1 = d[4 * j + 2 * h + 1] + b1;
        *reinterpret_cast<float2*>(yf + (r_base + 8 * h) * N + col) = make_float2(old[jj][h].x + v0, old[jj][h].y + v1);
      }
    }
  }
}

}  // namespace kiln::cuda
