// Matrix products of the forward pass: y(M, N) = x(M, K) . W(N, K)^T (+ bias(N)), bf16 x and W
// (row-major, K contiguous: the layout of every weight), fp32 accumulation, written per OutMode.
//   gemv: decode batches, M <= 16: memory-bound, streams W once with 16-byte loads straight into
//         mma.sync fragments (W read once for all M rows; see gemv.cu).
//   gemm: prefill, any M: tensor cores (mma.sync m16n8k16, ldmatrix, cp.async pipeline; gemm.cu).
//   gemm_splitk: batched decode, kGemvMaxRows < M <= kSplitKMaxRows (design below).
//   matmul: picks one by M. Both need no alignment beyond that of cudaMalloc rows; K % 8 != 0
//   takes a slow scalar path (no model has such a K; tests cover it).
#pragma once

#include "kernels/cuda/common.h"
#include "kernels/cuda/rope_kv_target.h"

namespace kiln::cuda {

constexpr int kGemvMaxRows = 16;

// Split-K GEMM for batched decode (16 < M <= 256). There the products are memory-bound (W, N*K*2
// bytes, dominates) but the GEMM's grid is too small to stream W at the copy bandwidth: at M = 64,
// o / down (N = 4096) make 32 tiles of 128x128 for 132 SMs, and a resident block streams only
// ~22-42 GB/s (latency-bound), so o ran at 0.89 TB/s and down at 1.37 (H200 profile, b = 64).
// gemm_splitk splits K into S slices: block (m tile, n tile, z) multiplies its tile over K slice z
// (the same wgmma + TMA kernel as gemm v4, 128x128 tiles, or the mma.sync v2 kernel where wgmma
// cannot run) and stores the fp32 partial, without bias, to slice z of a workspace (S, M, N); a
// second kernel sums the S slices in slice order 0..S-1 (fixed: the result is bit-reproducible,
// whatever order the blocks ran in), adds the bias and writes y per OutMode. S is chosen on the host
// from M, N, K and the SM count only (a time model of waves of resident blocks plus the reduce; see
// gemm.cu); S = 1 (no gain predicted, e.g. gate_up / lm_head whose grids already fill the GPU) runs
// the unsplit default GEMM. The workspace is the caller's (the CUDA backend carves it from its
// activation arena: a fixed address, so captured graphs stay valid) and caps S at floats / (M * N).
// Alternative considered: a GEMV-style kernel (gemv v2: W in registers, read once for all M rows)
// generalized to M = 64..256; it needs M / 8 MMAs per weight load and 4-16x the activation
// fragments per lane, i.e. a new kernel per M range; split-K reuses the tested tile kernels.
// KILN_GEMM_SPLITK: unset / "auto" = the choice above, "0" = never split (the previous path, for
// comparison), n = force n slices in matmul.
constexpr int64_t kSplitKMaxRows = 256;
constexpr int kSplitKMaxSplits = 16;                            // the auto choice's (and env's) limit
constexpr int64_t kSplitKWorkspaceFloats = int64_t(4) << 20;    // 16 MB: S * M * N for every Llama shape
struct MatmulWorkspace {
  float* data = nullptr;  // 16-byte aligned
  int64_t floats = 0;
};

void gemv(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
          cudaStream_t stream);
void gemm(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
          cudaStream_t stream);
// Kernel-lab hooks: run one version (1 .. *_versions(), the v1, v2, ... of the .cu file headers)
// instead of the default choice (version 0 = what gemv / gemm run).
int gemv_versions();
void gemv_version(int version, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream);
int gemm_versions();
void gemm_version(int version, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream);
// Split-K: the number of K slices gemm_splitk would use (1 = it runs the unsplit gemm_version).
// version: 0 = default (wgmma partials on sm_90a, else mma.sync v2), 2 = mma.sync v2, 4 = wgmma (v2
// where it cannot run); splits: 0 = auto, n >= 1 = n slices (fewer when K has fewer steps, or the
// workspace holds fewer slices of M * N floats).
int gemm_splitk_plan(int version, int splits, int64_t M, int64_t N, int64_t K, int64_t workspace_floats);
// y = x . W^T (+ bias) per mode with K split as gemm_splitk_plan says; returns the slices used. Any M.
int gemm_splitk(int version, int splits, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode,
                int64_t M, int64_t N, int64_t K, MatmulWorkspace ws, cudaStream_t stream);
// matmul's split-K step: runs gemm_splitk (auto or KILN_GEMM_SPLITK slices) and returns true when
// kGemvMaxRows < M <= kSplitKMaxRows, ws is given and KILN_GEMM_SPLITK is not "0"; else false.
bool matmul_splitk(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                   int64_t K, MatmulWorkspace ws, cudaStream_t stream);

// The gate/up product and SwiGLU in one GEMM for M > kGemvMaxRows (gemm_wgmma.h,
// gemm_wgmma_swiglu): h = silu(x . Wg^T) * (x . Wu^T), the bits of gemm + silu_mul. gemm_swiglu_ok
// says whether it runs for these operands (Hopper, the shape, the default GEMM version, no split-K
// for these rows, and KILN_GEMM_SWIGLU not "0": the switch for same-run comparison); gemm_swiglu
// launches it and returns false where it cannot.
bool gemm_swiglu_ok(const bf16* x, const bf16* w_gu, const bf16* h, int64_t M, int64_t inter, int64_t K);
bool gemm_swiglu(const bf16* x, const bf16* w_gu, bf16* h, int64_t M, int64_t inter, int64_t K, cudaStream_t stream);

// Greedy ids of a head product without its logits (session 34; gemm_wgmma.h, gemm_wgmma_argmax):
// ids[r] = the argmax over n of (x . W^T)(r, n), ties to the lowest n, 0 for a row of NaN: the ids
// cuda::argmax (sampling.h) picks from the logits gemm(..., store_f32) writes for these operands.
// parts: gemm_argmax_parts(M, N) float2 of scratch. gemm_argmax_ok says whether it runs (Hopper, the
// shape, the default GEMM version, M > kSplitKMaxRows so the logits' GEMM is unsplit, and
// KILN_HEAD_ARGMAX not "0": the switch for same-run comparison); gemm_argmax launches the GEMM and
// the partials' reduction and returns false, launching nothing, where it cannot.
constexpr int64_t kGemmArgmaxTileCols = 256;
inline int64_t gemm_argmax_parts(int64_t M, int64_t N) {
  return M * ((N + kGemmArgmaxTileCols - 1) / kGemmArgmaxTileCols);
}
bool gemm_argmax_ok(const bf16* x, const bf16* w, int64_t M, int64_t N, int64_t K);
bool gemm_argmax(const bf16* x, const bf16* w, float2* parts, int32_t* ids, int64_t M, int64_t N, int64_t K,
                 cudaStream_t stream);

// The qkv projection of M tokens with RoPE and the K/V write in the GEMM's epilogue (session 35;
// gemm_wgmma.h's gemm_wgmma_rope): q rotated into t.q_out, K/V (bf16, or quantized per (token, KV
// head)) into t.kv, the same bits as gemm then rope_qkv / rope_qkv_slots, and no (M, q_dim +
// 2 kv_dim) qkv rows in memory. gemm_rope_kv_ok says whether it runs (Hopper, the default GEMM
// version, M > kSplitKMaxRows so the plain product is unsplit, the shapes gemm_wgmma_rope_can_run
// takes, and KILN_GEMM_ROPE not "0": the switch for same-run comparison); gemm_rope_kv returns
// false, launching nothing, where it cannot.
bool gemm_rope_kv_ok(const bf16* x, const bf16* w, int64_t M, int64_t K, const RopeKvTarget& t);
// The switch as a call (tests compare both paths in one process; not for concurrent use).
void set_gemm_rope_kv_enabled(bool on);
bool gemm_rope_kv(const bf16* x, const bf16* w, const bf16* bias, const RopeKvTarget& t, int64_t M, int64_t K,
                  cudaStream_t stream);

// ws: split-K scratch for kGemvMaxRows < M <= kSplitKMaxRows (without it those M run the unsplit gemm).
inline void matmul(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                   int64_t K, cudaStream_t stream, MatmulWorkspace ws = {}) {
  if (M <= kGemvMaxRows)
    gemv(x, w, bias, y, mode, M, N, K, stream);
  else if (!matmul_splitk(x, w, bias, y, mode, M, N, K, ws, stream))
    gemm(x, w, bias, y, mode, M, N, K, stream);
}

}  // namespace kiln::cuda
