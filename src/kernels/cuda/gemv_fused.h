// Decode GEMVs (one token, M = 1, bf16 weights) with the pointwise kernel after them folded into
// their epilogue, so a layer of a batch-1 decode step is 7 kernels instead of 9:
//   gemv_rope_kv: qkv projection -> RoPE -> q out, K/V into the cache (replaces qkv GEMV + rope_qkv;
//                 an 8-bit cache through RopeKvTarget::q8, each KV head's last block encoding it)
//   gemv_swiglu:  gate/up projection -> silu(gate) * up              (replaces gate_up GEMV + silu_mul)
// How (gemv_mma.cuh's kernel with the row choice and the epilogue replaced): a block's 16 weight
// rows are two runs of 8 (rows g and g + 8 of its MMA tile), chosen so the two values a pointwise op
// needs meet in one warp: q/k rows i and i + rot_dim/2 of a head (RoPE's rotate-half pairs;
// interleaved pairs (2i, 2i+1) are neighbours already), gate row i and up row i. One shuffle brings
// the partner. Results are bit-identical to the unfused kernels (pointwise_math.cuh holds the
// shared arithmetic; the GPU tests compare the two paths bit for bit) unless the norm is folded too.
// The RMSNorm in front of them is folded too (session 12; NormProduce / NormApply below): the
// residual-add GEMV before it writes the norm's input and partial sums, these GEMVs scale their
// products, and a layer of a batch-1 decode step is 5 kernels (gemv_add_norm is o and down). An
// earlier try, every block normalizing the fp32 residual row into shared memory in its prologue,
// measured slower than the rmsnorm kernel and was dropped (docs/PERFORMANCE.md, session 4).
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/rope_kv_target.h"

namespace kiln::cuda {

// Whether gemv_rope_kv takes this shape: head_dim and rot_dim multiples of 16 (a block's 16 rows
// never straddle a head or the rotated part), K a multiple of 8.
bool gemv_rope_kv_fusable(int rot_dim, int head_dim, int64_t K);
// The fused qkv GEMV's checks of its target, bf16 and int8 / int4 alike: the shape above, K/V
// written by slot into a paged pool, and a bf16 cache or a quantized one with its staging
// (RopeKvTarget::q8) (KILN_CUDA_REQUIRE). Returns the projection's rows, q_dim + 2 kv_dim.
int64_t require_rope_kv_target(const RopeKvTarget& out, int64_t K);

// The RMSNorm between a residual-add GEMV (o, down) and the GEMV after it (gate/up, the next
// layer's qkv), split between the two so no kernel runs between them (session 12). rmsnorm(x) =
// (x o w) s with s = rsqrt(mean(x^2) + eps) one scalar per row, so W . rmsnorm(x) = s (W . (x o w)):
// the residual-add GEMV writes z = bf16(x o w) and x^2 summed over each of its 16-row tiles
// (NormProduce), and the next GEMV multiplies its products by s (NormApply: it sums the tiles'
// partials in a fixed order), before its bias and pointwise epilogue. The rounding differs from
// rmsnorm then GEMV (z is rounded to bf16 before the scale, not after): not the same bits, the same
// accuracy (tests/gpu/norm_fold_test.cpp against the CPU reference; the backend tests against the
// unfolded step and, at capacity 300, the CPU backend).
struct NormProduce {
  const bf16* weight = nullptr;  // the norm's weight, N values
  bf16* z = nullptr;             // N: bf16(x_new o weight), the next GEMV's input
  float* sumsq = nullptr;        // N / 16: sum of x_new^2 over each 16-row tile, in tile order
};
struct NormApply {
  const float* sumsq = nullptr;  // the NormProduce's partials, K / 16 of them; null: nothing to apply
  int tiles = 0;                 // K / 16
  float eps = 0.0f;
};

// The checks of a NormApply against the GEMV's K (K / 16 partials, or none) and of a NormProduce
// against its GEMV's N (whole 16-row tiles, every pointer set) (KILN_CUDA_REQUIRE).
void require_norm_apply(const NormApply& norm, int64_t K);
void require_norm_produce(const NormProduce& norm, int64_t N);

// x (K) bf16; w (q_dim + 2 kv_dim, K) = [wq | wk | wv] bf16, bias optional. norm: x is z of a
// NormProduce (the products are scaled by its s before the bias and RoPE).
void gemv_rope_kv(const bf16* x, const bf16* w, const bf16* bias, const RopeKvTarget& out, int64_t K,
                  cudaStream_t stream, const NormApply& norm = {});
// x (K) bf16; w (2 inter, K) = [w_gate | w_up]; h (inter) bf16 = silu(gate) * up. Needs inter % 8 == 0,
// K % 8 == 0. norm as gemv_rope_kv's.
void gemv_swiglu(const bf16* x, const bf16* w, bf16* h, int64_t inter, int64_t K, cudaStream_t stream,
                 const NormApply& norm = {});
// When a residual-add GEMV with the norm's first half lets the kernel after it launch (PDL,
// pdl.cuh): right after its own wait (the next kernel's blocks then request their weights during
// this one's tail), or only as its blocks exit. Which one the batch-1 step uses, and what each
// measured: backend/cuda/norm_fold_rule.h (session 46).
enum class NextLaunch { after_wait, at_exit };

// y (N) fp32 += W . x (the residual add of o and down, the plain GEMV's bits), then the first half of
// the next RMSNorm into `norm` (NormProduce). Needs N % 16 == 0, K % 8 == 0; M = 1.
void gemv_add_norm(const bf16* x, const bf16* w, float* y, const NormProduce& norm, int64_t N, int64_t K,
                   cudaStream_t stream, NextLaunch next = NextLaunch::after_wait);

}  // namespace kiln::cuda
