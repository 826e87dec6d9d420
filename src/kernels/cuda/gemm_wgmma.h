// Internal to gemm.cu (and the tests): the sm_90a wgmma + TMA GEMM of gemm_wgmma.cu, gemm version 4.
#pragma once

#include <cuda.h>  // CUtensorMap

#include "kernels/cuda/common.h"
#include "kernels/cuda/rope_kv_target.h"

namespace kiln::cuda {

// True when the current device is compute capability 9.0 and this binary holds the sm_90a kernel.
bool gemm_wgmma_available();
// Launches y = x . W^T (+ bias) per OutMode and returns true; returns false and launches nothing when
// the kernel cannot run it (not available, K % 8 != 0, x or W not 16-byte aligned), so the caller
// can fall back.
bool gemm_wgmma(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                int64_t K, cudaStream_t stream);

// Split-K partial pass (gemm.cu's gemm_splitk): `splits` slices of k_steps_per_split 64-wide K steps
// (128x128 tiles, grid z = slice); slice z writes its fp32 partial x . W^T over its K range, without
// bias, to partials + z * M * N. Returns false and launches nothing when it cannot run (as gemm_wgmma,
// or a slice would be empty).
bool gemm_wgmma_splitk(const bf16* x, const bf16* w, float* partials, int64_t M, int64_t N, int64_t K, int splits,
                       int k_steps_per_split, cudaStream_t stream);
// The current device's SM count when gemm_wgmma_available(), else 0.
int gemm_wgmma_sms();

// gemm version 5 (gemm_wgmma_persistent.cu): persistent grid, tiles handed out round-robin, the TMA
// ring running on across tiles. config: 0 = auto (per shape: v4 or one of these, by rounds of tiles
// and measured rates), 1 = ping-pong 128x128 (the two consumer warpgroups own alternate tiles),
// 2 = cooperative 128x192, 3 = cooperative 128x256, 4 = 3 with a TMA-store epilogue (bf16 output
// with N % 8 == 0, else 3), 5 = cooperative 128x224, 6 = 5 with a TMA-store epilogue (else 5),
// 7 / 8 = cooperative 128x128 / 128x192 with a TMA-store epilogue (else v4 / 2; session 9: what
// auto takes for bf16 outputs at M > 256 where it would pick v4, 1 or 2), 9 / 10 = cooperative
// 128x256 / 128x128 adding into an fp32 add_f32 target through TMA reduce-adds (N % 4 == 0; else
// 3 / v4; since session 10 what auto takes for add_f32 outputs where it would pick 3 / v4).
// Returns false and launches nothing where it cannot run (as gemm_wgmma).
bool gemm_wgmma_persistent(int config, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode,
                           int64_t M, int64_t N, int64_t K, cudaStream_t stream);
// The config auto picks for this shape on this device, for a bf16 output: 1..4, or 7 / 8 (the
// 128x128 / 128x192 picks with the TMA-store epilogue, M > 256; never 5 / 6: measured no better,
// gemm_wgmma_persistent.cu's header), or 0 (v4: one round of 128x128 tiles; or the kernel cannot run).
// bf16_out false: the plan for an fp32 output (no TMA-store twins), before the reduce-add swap.
int gemm_wgmma_persistent_plan(int64_t M, int64_t N, int64_t K, bool bf16_out = true);
// Kernel-lab hook (kernel_lab --overlap): the persistent GEMMs plan and launch as if the device had
// at most `sms` SMs (0: all of them), leaving the rest to a kernel run beside them on another stream.
// Not for use while another thread launches GEMMs.
void gemm_persistent_set_sm_limit(int sms);

// gemm version 12 (gemm_wgmma_cluster.cu): 128x256 tiles, each computed by a 2-CTA cluster that
// splits K in two and exchanges the partials through distributed shared memory (for the one-round
// M = 512 shapes, e.g. o). Returns false and launches nothing where it cannot run (as gemm_wgmma, or
// no cluster of 2 of it fits on the device).
bool gemm_wgmma_cluster(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                        int64_t K, cudaStream_t stream);
// Clusters of 2 of version 12's kernel that can be resident at once (cudaOccupancyMaxActiveClusters);
// 0 where it cannot run. A one-round launch needs m_tiles x n_tiles of them.
int gemm_wgmma_cluster_max_active();

// gemm versions 13 / 14 / 15 (gemm_wgmma_multicast.cu): v4's cooperative 128 x bn tile (bn = 128 /
// 192 / 256), run by 2-CTA clusters of adjacent M tiles that load one half each of their shared W
// tile and multicast it to both. Returns false and launches nothing where it cannot run (as
// gemm_wgmma, another bn, or no cluster of 2 of it fits on the device).
bool gemm_wgmma_multicast(int bn, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M,
                          int64_t N, int64_t K, cudaStream_t stream);
// Clusters of 2 of the bn instantiation that can be resident at once; 0 where it cannot run.
int gemm_wgmma_multicast_max_active(int bn);

// h(M, inter) = silu(x . Wg^T) * (x . Wu^T), W = [Wg; Wu] the (2 inter, K) gate/up matrix: version 5's
// 128x256 TMA-store configuration with the B tile loaded as 128 gate rows over the 128 matching up
// rows, so each tile ends as 128 columns of h (gemm_wgmma_persistent.cu). The same bits as the
// gate/up GEMM then silu_mul. can_run: sm_90a, the shape limits, inter % 128 == 0, h 16-byte
// aligned, and the plan picks that configuration for the unfused (M, 2 inter) GEMM. The launch
// expects operands can_run accepted (matmul.h's gemm_swiglu checks once); it returns false and
// launches nothing only if a tensor map cannot be made.
bool gemm_wgmma_swiglu_can_run(const bf16* x, const bf16* w_gu, const bf16* h, int64_t M, int64_t inter, int64_t K);
bool gemm_wgmma_swiglu(const bf16* x, const bf16* w_gu, bf16* h, int64_t M, int64_t inter, int64_t K,
                       cudaStream_t stream);

// The greedy head (session 34): for each row r of x . W^T (fp32 products, no bias) and each
// 256-column tile t, parts[r * ceil(N / 256) + t] = the tile's best (value, id) in argmax_order.cuh's
// order, the id's bits in .y; no product is stored. Version 5's config 3 (128x256 tiles, register
// epilogue) with the pair reduction as its epilogue, so the products are the store_f32 GEMM's.
// can_run: sm_90a, the shape limits, and the plan picks config 3 for a store_f32 output of this
// shape. The launch expects operands can_run accepted (matmul.h's gemm_argmax); false, launching
// nothing, only if a tensor map cannot be made.
bool gemm_wgmma_argmax_can_run(const bf16* x, const bf16* w, int64_t M, int64_t N, int64_t K);
bool gemm_wgmma_argmax(const bf16* x, const bf16* w, float2* parts, int64_t M, int64_t N, int64_t K,
                       cudaStream_t stream);

// The qkv projection with RoPE in its epilogue (session 35, gemm_rope_epilogue.cuh): x . W^T for
// W = [Wq; Wk; Wv] ((q_dim + 2 kv_dim), K), no product stored; q rotated into t.q_out and K/V into
// t.kv (bf16, or quantized per (token, KV head)) at t.position[i] / t.slot[i], the same bits as the
// GEMM (config 4) then rope_qkv / rope_qkv_slots. can_run: sm_90a, the shape limits, full rotation,
// head_dim 64 / 128 / 256, q_dim and kv_dim multiples of 256, the target's alignment, and the plan
// picks config 4 for the plain product. The launch expects a target can_run accepted.
bool gemm_wgmma_rope_can_run(const bf16* x, const bf16* w, int64_t M, int64_t K, const RopeKvTarget& t);
void gemm_wgmma_rope(const bf16* x, const bf16* w, const bf16* bias, const RopeKvTarget& t, int64_t M, int64_t K,
                     cudaStream_t stream);

// Session 11: version 5's TMA-epilogue configurations with fp8 operands (W8A8: e4m3 x (M, K) and
// W (N, K), one fp32 scale per x row in xs and per W row in ws, y = acc * xs[m] * ws[n] + bias, as
// fp8_gemm_wgmma.cu's kernel). config: 0 = auto (the bf16 plan's tile), 4 / 7 / 8 = 128x256 /
// 128x128 / 128x192 with TMA stores (store_bf16, N % 8 == 0), 9 / 10 = 128x256 / 128x128 with TMA
// reduce-adds (add_f32, N % 4 == 0). Returns false and launches nothing for another mode, a config
// that does not match the mode, or operands it cannot take (K % 16, 16-byte alignment of xq, W, y).
bool gemm_wgmma_fp8(int config, const uint8_t* xq, const float* xs, const uint8_t* w, const float* ws,
                    const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K, cudaStream_t stream);
// From this many rows fp8_gemm and the backend take these configurations (session 11 measured them at
// M = 512..4096, as the bf16 plan's TMA epilogues; the batched-decode sizes below keep the
// one-tile-per-block fp8 kernel, which was what ran there before).
constexpr int64_t kFp8PersistentMinRows = 257;
// h = silu(xq . Wg^T) * (xq . Wu^T) with fp8 operands, each product scaled and rounded to bf16 first
// (what the fp8 GEMM then silu_mul store): gemm_wgmma_swiglu's tiles. can_run as the bf16 one's; the
// launch, as the bf16 one, expects operands can_run accepted (it returns false, launching nothing,
// for null scales or a tensor map that cannot be made).
bool gemm_wgmma_fp8_swiglu_can_run(const uint8_t* xq, const uint8_t* w_gu, const bf16* h, int64_t M, int64_t inter,
                                   int64_t K);
bool gemm_wgmma_fp8_swiglu(const uint8_t* xq, const float* xs, const uint8_t* w_gu, const float* ws, bf16* h,
                           int64_t M, int64_t inter, int64_t K, cudaStream_t stream);

// Shared by the wgmma GEMM files: the shape / alignment limits (K % 8 == 0, 16-byte aligned x and W,
// int coordinates), and the (rows, K) bf16 tensor map with (64, box_rows) boxes, 128-byte swizzle.
bool wgmma_shape_ok(const bf16* x, const bf16* w, int64_t M, int64_t N, int64_t K);
bool wgmma_make_map(CUtensorMap* map, const bf16* p, int64_t rows, int64_t K, int box_rows);
// The same for (rows, K) e4m3 bytes: (128, box_rows) boxes. K % 16 == 0.
bool wgmma_make_map_e4m3(CUtensorMap* map, const uint8_t* p, int64_t rows, int64_t K, int box_rows);

}  // namespace kiln::cuda
