// Per-token fp8 quantization of activations (the A of W8A8): for each row of x (M, K) bf16,
//   scale = amax(|x|) / 448,  q[k] = e4m3(x[k] * (448 / amax))  (round to nearest even, saturating
//   to +-448: cvt.rn.satfinite, what __nv_fp8_e4m3 does; the CPU's quant::fake_quantize computes the
//   same);  a zero row gets scale 0 and q 0.
// One block per row: 16-byte loads, a block max, then a second pass over the row (L1/L2-resident:
// 2K bytes) writing 8 bytes per 8 values. Memory-bound and small next to the GEMM it feeds
// (M*K*3 bytes against N*K weight bytes).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/quant/qmatmul.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) fp8_quantize_kernel(const bf16* __restrict__ x, int64_t K,
                                                                 uint8_t* __restrict__ xq, float* __restrict__ xs) {
  __shared__ float warp_max[kThreads / 32];
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * K;
  uint8_t* qr = xq + row * K;
  const bool vec = K % 8 == 0;
  float amax = 0.0f;
  if (vec) {
    for (int64_t c = threadIdx.x; c < K / 8; c += kThreads) {
      float f[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(xr) + c), f);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
    }
  } else {
    for (int64_t k = threadIdx.x; k < K; k += kThreads) amax = fmaxf(amax, fabsf(__bfloat162float(xr[k])));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  // As the CPU reference (quant::fake_quantize): q = e4m3(x * (448 / amax)), scale = amax / 448.
  const float scale = __fdiv_rn(amax, 448.0f), inv = amax > 0.0f ? __fdiv_rn(448.0f, amax) : 0.0f;
  if (threadIdx.x == 0) xs[row] = scale;
  auto q = [&](float v) { return __fmul_rn(v, inv); };
  if (vec) {
    for (int64_t c = threadIdx.x; c < K / 8; c += kThreads) {
      float f[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(xr) + c), f);
      uint32_t out[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(q(f[4 * h]), q(f[4 * h + 1])), __NV_SATFINITE, __NV_E4M3);
        const uint32_t hi =
            __nv_cvt_float2_to_fp8x2(make_float2(q(f[4 * h + 2]), q(f[4 * h + 3])), __NV_SATFINITE, __NV_E4M3);
        out[h] = lo | (hi << 16);
      }
      reinterpret_cast<uint2*>(qr)[c] = make_uint2(out[0], out[1]);
    }
  } else {
    for (int64_t k = threadIdx.x; k < K; k += kThreads)
      qr[k] = __nv_cvt_float_to_fp8(q(__bfloat162float(xr[k])), __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

void fp8_quantize_rows(const bf16* x, int64_t M, int64_t K, uint8_t* xq, float* xs, cudaStream_t stream) {
  if (M == 0) return;
  KILN_CUDA_REQUIRE(M < (int64_t(1) << 31), "fp8_quantize_rows: too many rows");
  fp8_quantize_kernel<<<unsigned(M), kThreads, 0, stream>>>(x, K, xq, xs);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
