// The fused decode GEMVs of gemv_fused.h for bf16 weights: gemv_mma.cuh's kernel with the pairing
// epilogues of gemv_epilogues.cuh (the int8 / int4 forms are in quant/qgemv_v3.cu).
#include "kernels/cuda/gemv_fused.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv_epilogues.cuh"

namespace kiln::cuda {

bool gemv_rope_kv_fusable(int rot_dim, int head_dim, int64_t K) {
  return head_dim % 16 == 0 && rot_dim % 16 == 0 && rot_dim <= head_dim && K % 8 == 0;
}

int64_t require_rope_kv_target(const RopeKvTarget& out, int64_t K) {
  KILN_CUDA_REQUIRE(gemv_rope_kv_fusable(out.rot_dim, out.head_dim, K), "fused qkv GEMV: unsupported shape");
  KILN_CUDA_REQUIRE(out.slot || !out.kv.paged(), "fused qkv GEMV: a paged pool is written by slot");
  KILN_CUDA_REQUIRE(!out.kv.quantized() || (out.q8.values && out.q8.sync),
                    "the fused qkv GEMV into a quantized cache needs its staging (RopeKvTarget::q8)");
  return int64_t(out.n_heads + 2 * out.n_kv_heads) * out.head_dim;
}

void require_norm_apply(const NormApply& norm, int64_t K) {
  KILN_CUDA_REQUIRE(!norm.sumsq || (K % 16 == 0 && norm.tiles == K / 16), "NormApply: K / 16 tile partials");
}

void require_norm_produce(const NormProduce& norm, int64_t N) {
  KILN_CUDA_REQUIRE(N % 16 == 0, "NormProduce: the rows must be whole 16-row tiles");
  KILN_CUDA_REQUIRE(norm.weight && norm.z && norm.sumsq, "NormProduce: weight, z and sumsq");
}

void gemv_rope_kv(const bf16* x, const bf16* w, const bf16* bias, const RopeKvTarget& out, int64_t K,
                  cudaStream_t stream, const NormApply& norm) {
  const int64_t N = require_rope_kv_target(out, K);
  require_norm_apply(norm, K);
  if (out.kv.quantized())
    launch_gemv_mma<1>(x, w, 1, N, K, N / 16, RopeKvQuantEpi{bias, out, norm}, stream);
  else
    launch_gemv_mma<1>(x, w, 1, N, K, N / 16, RopeKvEpi{bias, out, norm}, stream);
  KILN_CUDA_CHECK_LAUNCH();
}

void gemv_swiglu(const bf16* x, const bf16* w, bf16* h, int64_t inter, int64_t K, cudaStream_t stream,
                 const NormApply& norm) {
  KILN_CUDA_REQUIRE(inter % 8 == 0 && K % 8 == 0, "gemv_swiglu: inter and K must be multiples of 8");
  require_norm_apply(norm, K);
  launch_gemv_mma<1>(x, w, 1, 2 * inter, K, inter / 8, SwiGluEpi{h, inter, norm}, stream);
  KILN_CUDA_CHECK_LAUNCH();
}

void gemv_add_norm(const bf16* x, const bf16* w, float* y, const NormProduce& norm, int64_t N, int64_t K,
                   cudaStream_t stream, NextLaunch next) {
  KILN_CUDA_REQUIRE(K % 8 == 0, "gemv_add_norm: K % 8 must be 0");
  require_norm_produce(norm, N);
  launch_gemv_mma<1>(x, w, 1, N, K, N / 16, AddNormRows{y, norm, next == NextLaunch::after_wait}, stream);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
