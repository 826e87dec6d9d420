// Matrix products with quantized weights: y(M, N) = x(M, K) . W(N, K)^T (+ bias), W stored in one
// of model/quantized_matrix.h's formats in the device layout below, x bf16, fp32 accumulation,
// y written per OutMode. What runs, by format and M (qmatmul picks):
//
//   int8 / int4 (weight-only, W8A16 / W4A16):
//     M <= 16:  qgemv (qgemv.cu dispatches; the default is qgemv_v3.cu): 16-row weight tiles, each
//               warp streaming a contiguous range of 16-byte pieces straight into mma.sync fragments
//               with 4 super-chunks in flight, dequantization fused: the bits become exact small
//               integers in bf16 with one LOP3 per two values (int8 with x staged: whole bytes in
//               fp16, one PRMT per two values; below), the MMA sums them against x (staged
//               in shared memory with its per-group sums), and the scale and min are applied per
//               group in fp32.
//     M <= 64:  qgemv over 16-row slices of x (W is read ceil(M / 16) times; still fewer bytes than
//               one pass over a bf16 copy of W for int4 up to M = 64).
//     M > 64:   dequantize W into a bf16 scratch matrix (dequant.cu), then the bf16 matmul (wgmma
//               GEMM / split-K). Cost: one extra write + read of N*K*2 bytes per call (gate_up of
//               Llama-3-8B: 470 MB, ~0.12 ms against ~0.7 ms of GEMM at M = 2048): correct and simple,
//               not fast; a Marlin-style fused tile GEMM is the next step.
//   fp8 (W8A8, e4m3 weights with one scale per row, activations quantized per token at run time):
//     every M:  fp8_quantize_rows (act_quant.cu): per row of x, scale = amax / 448, q = e4m3(x * 448 / amax)
//               (round to nearest even, saturating), into a scratch (M, K) byte matrix + M scales;
//               skipped when the RMSNorm in front wrote them (elementwise.h's rmsnorm_fp8, xq_ready).
//     M <= 16:  fp8_gemv (fp8_gemv.cu): both operands converted e4m3 -> f16 (exact) in registers, f16
//               mma.sync, y = acc * scale_x[m] * scale_w[n]: the same products as the CPU reference.
//     M > 16:   fp8_gemm (sm_90a): wgmma m64nNk32 e4m3 x e4m3 from TMA-fed shared memory, in the
//               persistent bf16 GEMM's TMA-store / reduce-add configurations (gemm_wgmma.h's
//               gemm_wgmma_fp8, session 11) for bf16 stores and residual adds from 257 rows, else in
//               fp8_gemm_wgmma.cu's one-tile-per-block kernel; elsewhere fp8_gemv over 16-row slices.
//               fp8_gemm_swiglu: gate/up with SwiGLU in the epilogue (the backend's prefill).
//
// Device layouts (what the upload packs to; pack_quantized in qpack.cu writes them):
//   int4 (K % 128 == 0): a row is K / 128 super-chunks of 64 bytes, one 16-byte piece per lane t = 0..3
//     of a GEMV quad (lane t reads bytes 16t .. 16t + 15: the four lanes read 64 contiguous bytes).
//     Word j (bytes 4j .. 4j + 3) of piece t holds k = 128 sc + 32 j + 8 t + i, i = 0..7, as unsigned
//     nibbles; nibble p (bits 4p .. 4p + 3) holds i = 2p for p < 4 and i = 2(p - 4) + 1 for p >= 4, so
//     ((w >> 4s) & 0x000F000F) | 0x43004300 is the bf16 pair (128 + q[i = 2s], 128 + q[2s + 1]):
//     exact, and the matching activations (x[k], x[k + 1]) are one natural bf16x2 register. The 16 k
//     of one m16n8k16 MMA (4 per lane of the quad) lie in one 32-wide group, so groups of 32 and of
//     128 both work; scales and mins are applied per group outside the MMA.
//   int8 (K % 64 == 0): u = q + 128 as a byte. A row is K / 64 super-chunks of 64 bytes; word j of
//     lane t's piece holds k = 64 sc + 32 (j / 2) + 8 t + 4 (j % 2) + i, i = 0..3, byte b holding
//     i = {0, 2, 1, 3}[b]; the low nibbles of bytes (0, 2) and (1, 3) become (128 + lo) pairs with
//     0x4300 and the high nibbles (2048 + 16 hi) pairs with 0x4500, two MMAs against the same x pair:
//     their sum is 2176 + u = q + 2304 per element. Since session 13, where x is staged in shared
//     memory (qgemv_v3.cu), one PRMT instead makes bytes (0, 2) and (1, 3) the fp16 pairs
//     (1024 + u), one fp16 MMA against x staged as fp16(x / 16); the fold shifts min' by 1152 scale.
//   fp8 (K % 16 == 0): e4m3 bytes, row-major as given (no repacking: cvt e4m3x2 -> f16x2 gives
//     natural pairs).
//   scales: int8 / int4: float2 {scale, min'} per (row, group), row-major, min' = min - off * scale
//     with off = 128 (int4) or 2304 (int8), so value . x = scale * sum((off + q) x) + min' * sum(x)
//     over a group (sum(x) by one more MMA with an all-ones A); fp8: one float per row.
//   Shapes off these multiples are not packed: the backend keeps such a matrix in bf16.
#pragma once

#include "kernels/cuda/gemv_fused.h"
#include "kernels/cuda/matmul.h"
#include "model/quantized_matrix.h"

namespace kiln::cuda {

// A quantized (or bf16) weight matrix on the device, in the layout above. Non-owning.
struct QWeight {
  QuantFormat format = QuantFormat::none;
  int64_t rows = 0, cols = 0, group = 0;  // group: columns per scale (fp8: cols)
  const void* data = nullptr;             // none: bf16 (rows, cols); else the packed bytes
  const float* scales = nullptr;          // int8/int4: float2 per (row, group); fp8: float per row
};

// Scratch the quantized paths need, owned by the caller (fixed addresses: safe in CUDA graphs).
struct QScratch {
  bf16* w = nullptr;       // int8/int4 at M > kQGemvSliceRows: a bf16 copy of W (rows * cols)
  int64_t w_elems = 0;
  uint8_t* xq = nullptr;   // fp8: quantized activations (rows, cols of x), 16-byte aligned
  float* xs = nullptr;     // fp8: one scale per activation row
  int64_t xq_bytes = 0, xs_rows = 0;
  // fp8: xq / xs already hold this product's x quantized (the fused rmsnorm_fp8 wrote them), so the
  // product skips fp8_quantize_rows.
  bool xq_ready = false;
};

constexpr int64_t kQGemvSliceRows = 64;  // int8/int4: up to this M, 16-row GEMV slices; beyond, dequant + GEMM

// Whether `format` can be packed for a (rows, cols) matrix with this group size.
bool qweight_packable(QuantFormat format, int64_t cols, int64_t group);
// Bytes of the packed data and of the scales.
int64_t qweight_data_bytes(QuantFormat format, int64_t rows, int64_t cols);
int64_t qweight_scale_floats(QuantFormat format, int64_t rows, int64_t cols, int64_t group);
// Bytes a product reads per weight element (data + scales): the cost model's weight width.
double qweight_bytes_per_weight(QuantFormat format, int64_t cols, int64_t group);

// Packs raw QuantizedMatrix bytes (device memory, rows * cols or rows * cols / 2 bytes) into `dst`
// (qweight_data_bytes). fp8 is a copy.
void pack_quantized(QuantFormat format, const uint8_t* raw, int64_t rows, int64_t cols, uint8_t* dst,
                    cudaStream_t stream);
// Random packed weights for speed runs: random bytes (fp8: no NaN codes) and scales giving values of
// about +-amplitude; counter hash of (seed, stream_id) so any size is generated in place.
void fill_random_qweight(QuantFormat format, int64_t rows, int64_t cols, int64_t group, uint8_t* data, float* scales,
                         uint64_t seed, uint64_t stream_id, float amplitude, cudaStream_t stream);

// y = x . W^T (+ bias) per mode, any M >= 1, dispatching as the header says. bf16 weights go to matmul.
void qmatmul(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int64_t M,
             cudaStream_t stream, MatmulWorkspace ws = {}, const QScratch& scratch = {});

// ---- the kernels, for tests and the kernel lab ----
// int8 / int4, 1 <= M <= 16. qgemv_set_version: 0 = default (v3), 1 = v1 (a step of weights in
// registers), 2 = v1 through a cp.async ring (slower: kept as evidence), 3 = v3 (a continuous ring of
// weight requests per warp, x and its group sums staged in shared memory, qgemv_v3.cu), 4 = v3 with
// x read from L2 and sum(x) by all-ones MMAs (what v3 does when x does not fit shared memory),
// 5 = v3 with one 16-row tile per block (v3 runs several per block, at most one wave of blocks);
// process-wide, for the kernel lab and tests.
void qgemv_set_version(int version);
void qgemv(const bf16* x, const QWeight& w, const bf16* bias, void* y, OutMode mode, int64_t M, cudaStream_t stream);
// The fused decode GEMVs (gemv_fused.h) for int8 / int4 weights, M = 1: qgemv v3 with the pairing
// epilogues, the unfused path's bits (qgemv, then rope_qkv or silu_mul). qgemv_fusable: the format
// and group take v3, rows % 16 == 0, x fits shared memory. qgemv_rope_kv: w = [wq | wk | wv];
// qgemv_swiglu: w = [w_gate | w_up] (2 inter rows). They always run v3 with x staged, so they
// match the unfused path only under the default qgemv version (qgemv_set_version 0, 3 or 5).
bool qgemv_fusable(const QWeight& w);
void qgemv_rope_kv(const bf16* x, const QWeight& w, const bf16* bias, const RopeKvTarget& out, cudaStream_t stream,
                   const NormApply& norm = {});
void qgemv_swiglu(const bf16* x, const QWeight& w, bf16* h, int64_t inter, cudaStream_t stream,
                  const NormApply& norm = {});
// gemv_add_norm (gemv_fused.h) for a qgemv_fusable int8 / int4 w: y (w.rows) fp32 += W . x, then
// the NormProduce; M = 1.
void qgemv_add_norm(const bf16* x, const QWeight& w, float* y, const NormProduce& norm, cudaStream_t stream,
                    NextLaunch next = NextLaunch::after_wait);
// W -> bf16 (rows, cols) row-major: value = q * scale + min rounded to bf16 (int8/int4/fp8).
void dequantize_to_bf16(const QWeight& w, bf16* dst, cudaStream_t stream);
// Per-token fp8 quantization of x (M, K): xq (M, K) e4m3 bytes, xs (M) scales (0 for a zero row).
void fp8_quantize_rows(const bf16* x, int64_t M, int64_t K, uint8_t* xq, float* xs, cudaStream_t stream);
// fp8 W8A8 from quantized activations; fp8_gemv: 1 <= M <= 16; fp8_gemm: any M, returns false (and
// launches nothing) when the wgmma kernel cannot run here (not sm_90a, K % 16 != 0, misaligned).
void fp8_gemv(const uint8_t* xq, const float* xs, const QWeight& w, const bf16* bias, void* y, OutMode mode,
              int64_t M, cudaStream_t stream);
// fp8_gemm's version: 0 = auto (2 where it runs, else 1), 1 = fp8_gemm_wgmma.cu's one tile per block,
// 2 = the persistent GEMM's fp8 configurations only (gemm_wgmma.h: bf16 stores and residual adds).
bool fp8_gemm(const uint8_t* xq, const float* xs, const QWeight& w, const bf16* bias, void* y, OutMode mode,
              int64_t M, cudaStream_t stream, int version = 0);
// h = silu(x . Wg^T) * (x . Wu^T) for fp8 W = [Wg; Wu] (2 inter rows) from 257 rows: x quantized per
// token into scratch, then the fused fp8 GEMM (gemm_wgmma.h). can_run: sm_90a, the shape and the
// tiles (as the bf16 gemm_swiglu_ok), and the scratch; fp8_gemm_swiglu returns false (nothing
// launched) where it cannot run.
bool fp8_gemm_swiglu_can_run(const bf16* x, const QWeight& w, const bf16* h, int64_t M, int64_t inter,
                             const QScratch& scratch);
bool fp8_gemm_swiglu(const bf16* x, const QWeight& w, bf16* h, int64_t M, int64_t inter, cudaStream_t stream,
                     const QScratch& scratch);
bool fp8_gemm_available();

}  // namespace kiln::cuda
