// Prefill GEMM on Hopper (sm_90a), gemm.cu's version 5: the wgmma + TMA main loop of gemm_wgmma.cu
// (v4; its header has the shared-memory layout, the descriptors and the accumulator layout) in a
// persistent grid. Same contract: y(M, N) = x(M, K) . W(N, K)^T (+ bias) per OutMode, bf16 operands
// K-major, fp32 accumulation, any M and N; K % 8 == 0 and 16-byte aligned x and W (wgmma_shape_ok).
//
// Why (v4 measured on the H200, run 5): 0.80x cuBLAS on qkv and gate_up at M = 512, 0.90-0.93x on
// most M = 2048 / 4096 shapes. Counting: (1) wave quantization. v4 launches one block per tile:
// qkv M = 512 is 192 tiles of 128x128 on 132 SMs (1.45 waves: the second wave is half empty),
// gate_up M = 512 is 448 tiles of 128x256 (3.39 waves -> 4). (2) Per-tile fixed cost: each block
// fills its TMA ring from empty (~1-2 us of a ~45 us 128x256 tile at K = 4096) and stores its
// epilogue from registers while the tensor cores idle (64 KB per tile, ~2 us at an SM's share of
// DRAM bandwidth): ~5-8% at K = 4096. down (K = 14336, the same tiles, overheads amortized over 3.5x
// longer main loops) reaches 775-783 TFLOP/s, which bounds what removing (2) can give.
//
// Design (the kernel and its configurations: gemm_wgmma_persistent_kernel.cuh; this file: the
// plan and the launches): grid = min(tiles, SMs) blocks of 3 warpgroups (1 TMA producer at 40
// registers, 2 wgmma consumers at 232), one block per SM; block b takes tiles b, b + grid, b + 2
// grid, ... (tile t: M fastest within groups of `group` m tiles, tile_mn: the blocks running at once
// share W tiles and re-read x from L2, as in v4, while the x rows of one group stay in L2 across its
// n tiles; see raster_group for why). The producer walks the block's tiles' K steps as one sequence
// (global step g = local tile j * k_steps + kt; stage g % STAGES, phase (g / STAGES) & 1), so it loads
// the next tile's first stages while the consumers finish the current tile and store it.
// Two consumer schedules (template PP):
//   ping-pong (PP, 128x128 tiles, 7 stages x 32 KB): consumer c owns the block's local tiles
//     j = c, c + 2, ...: all 128 rows (2 x wgmma m64n128k16 per k16, 128 accumulators per thread).
//     While one stores its tile, the other runs its main loop: the epilogue is off the tensor cores'
//     critical path. The two main loops are serialized by a pair of named barriers (consumer c
//     arrives after issuing its last K step of tile j; the other syncs before its tile j + 1). That
//     order is also what makes the parity waits valid: a consumer waits on full[s] for use u only
//     once use u - 1 has completed (the previous owner of those stages waited on it), so it is never
//     two phases ahead. Each stage is read by one consumer: empty[s] counts 1 arrival.
//   cooperative (!PP, 128x192 or 128x256): both consumers on every tile, rows [64c, 64c + 64), as
//     v4; empty[s] counts 2. For shapes where 128x128 tiles quantize badly (qkv M = 512: 192 tiles of
//     128x128 = 2 rounds on 132 SMs, 128 tiles of 128x192 = 1 round of 1.5x the work).
// The host picks per shape (config 0, plan()): v4 when the 128x128 tiles fit in one round, else the
// least of rounds x tile area / main-loop rate over the configurations (rates measured, see plan()).
//
// Prediction (H200, 132 SMs, mainloop at the ~775 TFLOP/s that down reaches in v4): ping-pong
// 128x128 ~700-740 TFLOP/s at M >= 2048 on every shape (>= 97% of rounds full; the epilogue hidden),
// gate_up M = 512 ~700 (896 tiles = 6.8 rounds -> 7), qkv M = 512 (cooperative 128x192, 128 tiles,
// 1 round) ~600, o / down M = 512 (128 tiles, 1 round: no second tile to overlap) ~ v4's 525 / 677.
// Measured (device run 1, same run as cuBLAS): ping-pong 128x128 reached only 615-620 at M = 4096
// (cooperative 128x256: 678-690). Likely causes (not isolated with counters): 128x128 tiles move
// ~25-30% more shared-memory bytes per FLOP (TMA writes and wgmma operand reads) than 128x256, and
// only one warpgroup issues at a time. It wins only where 128x256 tiles quantize badly (gate_up
// M = 512: 681 vs 594 for v4).
// Cooperative 128x192 took qkv M = 512 from 401 to 572. The persistent 128x256 alone (v8) was within
// +-3% of v4: the exposed epilogue, not the prologue, was the per-tile cost. Hence v9 (config 4):
// 128x256 with the epilogue through shared memory and TMA stores (3 stages + a 64 KB staging tile),
// so the consumers go on with the next tile while the TMA unit writes this one. Device run 2 (same
// run as cuBLAS; TFLOP/s, v4 -> v9 vs cuBLAS): qkv M=2048 682 -> 740 (751), M=4096 698 -> 746 (793);
// o 649 -> 716 (718), 681 -> 729 (775); gate_up 711 -> 781 (795), 696 -> 754 (708); down 791 -> 808
// (820), 787 -> 798 (820); lm_head 649 -> 724-787 (693), 620 -> 685 (694). The auto choice (v5)
// measured 0.90-1.14x cuBLAS on all 15 Llama-3-8B prefill shapes x M = 512 / 2048 / 4096. Noise:
// the same kernel timed twice in one run differed by up to 7% on lm_head M = 2048 (724 / 778) and
// 15% on down M = 512 (598 / 700, one round of 128 tiles), so differences under ~5% are not
// rankings. Decode side effect: at M = 64 gate_up's unsplit GEMM picks one round of 112 128x256
// tiles (v9) instead of v4's 224 128x128 blocks (1.7 waves): 90.1 -> 70.9 us (cuBLAS 71.9).
// Session 7 (untimed when written): configs 5 / 6 (gemm v10 / v11) are cooperative 128x224 tiles
// for gate_up at M = 512, where 128x128 ping-pong runs 896 tiles = 6.8 -> 7 rounds at the ping-pong
// rate (0.90 of 128x256) and 128x256 runs 448 tiles = 3.39 -> 4 rounds with 0.6 of the last one
// empty: 28672 / 224 = 128 n tiles x 4 m tiles = 512 tiles = 3.88 -> 4 rounds, 97% full. Predicted
// time in 128x128-tile units: 4 x 1.75 / ~0.95 = 7.4 against ping-pong's 7 / 0.90 = 7.8 (-5%) and
// 128x256's 4 x 2 / 1.0 = 8.0, before the epilogue: config 5 stores from registers with a 5-stage
// ring (5 x 44 KB), config 6 through a 56 KB staging tile and TMA stores in (64, 32) boxes (224 is
// no multiple of 64; 64B swizzle) with 3 stages. wgmma m64n224k16: 112 accumulators per thread.
// Measured (session 7 run 3, same run as cuBLAS, gate_up M = 512): v10 665.7, v11 687.3 TFLOP/s
// against v5's 679.1 and cuBLAS's 761.1: +1.2% at best, within the shape's run-to-run spread, so
// plan() does not pick them (docs/performance/gemm.md, session 7).
// Session 9: the SwiGLU configuration (gemm_wgmma_swiglu, PCfgCo256TSwiglu): config 4's 128x256
// tiles with B loaded as 128 gate rows over the 128 matching up rows (two TMA boxes per stage), so a
// consumer thread holds gate column j and up column j in accumulators d[4j + e] and d[4(j + 16) + e]
// and writes silu(g) * u, 128 columns of h per tile, through the TMA-store epilogue: the (M, 2I)
// gate|up rows never go to memory and the silu_mul kernel goes away (pp2048: 1.47 of 46.8 ms). It
// runs where plan() picks config 4 for the unfused (M, 2I) product (Llama-3-8B, 132 SMs: M = 17-384
// and M >= 769), so the tile count and the M-fastest walk are the unfused GEMM's (a tile's B rows
// are gate rows n0.. and up rows I + n0.. instead of 256 consecutive rows). With IEEE division in
// silu the fused kernel took 22.2 ms a pp2048 step (the consumers' epilogue math is on the tensor
// cores' critical path); with __fdividef 21.0 ms against 20.8 + 1.3 ms for the unfused pair in the
// same call (docs/performance/gemm.md, session 9).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/epilogue_add.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/gemm_wgmma_persistent_kernel.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace kiln::cuda {
namespace {

// The m tiles of a raster group (tile_mn). Why (session 17, H200): in the plain M-fastest order
// the blocks running at once cover every m tile and ~grid / m_tiles n tiles, so once x outgrows
// the L2 (60 MB on the H200 with W's tiles beside it: M = 8192 at K = 4096 is 64 MB) each round of
// tiles streams all of x from HBM again: gate_up at M = 8192 reads x ~56 times, ~3.6 GB a call,
// ~1.3 TB/s beside the tensor cores. In groups of G m tiles a round holds G m tiles of x and
// grid / G n tiles of W; G = 16 keeps that near its least (G x 1 MB + grid / G x 2 MB for 128x256
// tiles at K = 4096: ~33 MB) and x comes from HBM about once, W m_tiles / G times. Below G m tiles
// both orders are the same. Measured (run 3, lab M = 8192): G = 8 and 16 within 1% of each other
// (16 ahead on qkv, gate_up and down), G = 32 1-6% behind them.
// KILN_GEMM_RASTER=0 keeps the plain order (same-run comparison), =G another group size.
int raster_group(int64_t m_tiles) {
  static const int group = env_int("KILN_GEMM_RASTER", 16);
  return int(group > 0 ? std::min<int64_t>(group, m_tiles) : m_tiles);
}

// w: bf16 (N, K), or e4m3 bytes for C::FP8 (then xs / ws are the row scales of x and W).
template <class C>
void launch_persistent(const void* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K,
                       int sms, cudaStream_t stream, const CUtensorMap& mx, const CUtensorMap& my,
                       const float* xs = nullptr, const float* ws = nullptr, const RopeKvTarget& rope = {}) {
  static bool configured = false;  // raising the dynamic shared-memory limit once is enough
  if (!configured) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(gemm_wgmma_persistent_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         C::kSmemBytes));
    configured = true;
  }
  // W's map: BN rows a box, or for SwiGLU (N = I output columns) 2I rows in boxes of BN / 2, the
  // gate half and the up half loaded separately.
  CUtensorMap mw;
  const int64_t w_rows = C::SWIGLU ? 2 * N : N;
  const int box_rows = C::SWIGLU ? C::BN / 2 : C::BN;
  const bool mapped = C::FP8 ? wgmma_make_map_e4m3(&mw, static_cast<const uint8_t*>(w), w_rows, K, box_rows)
                             : wgmma_make_map(&mw, static_cast<const bf16*>(w), w_rows, K, box_rows);
  KILN_CUDA_REQUIRE(mapped, "gemm v5: tensor map");
  const int64_t m_tiles = (M + P_BM - 1) / P_BM, tiles = m_tiles * ((N + C::BN_OUT - 1) / C::BN_OUT);
  const unsigned grid = unsigned(std::min<int64_t>(tiles, sms));
  gemm_wgmma_persistent_kernel<C><<<grid, P_THREADS, C::kSmemBytes, stream>>>(
      mx, mw, my, bias, y, mode, M, N, K, xs, ws, raster_group(m_tiles), rope);
  KILN_CUDA_CHECK_LAUNCH();
}

int sm_limit = 0;  // gemm_persistent_set_sm_limit

int probed_sms() {
  static wgmma_ptx::HopperProbe probe;
  return probe.sms(std::max({PCfgPP128::kSmemBytes, PCfgCo192::kSmemBytes, PCfgCo256::kSmemBytes,
                             PCfgCo256T::kSmemBytes, PCfgCo224::kSmemBytes, PCfgCo224T::kSmemBytes}),
                   {reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgPP128>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo192>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256T>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo224>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo224T>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256TSwiglu>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256Argmax>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256TRope<KvQuant::none>>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256TRope<KvQuant::int8>>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256TRope<KvQuant::fp8>>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo128T>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo192T>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256Add>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo128Add>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo128TF8>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo192TF8>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256TF8>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256TSwigluF8>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo256AddF8>),
                    reinterpret_cast<const void*>(gemm_wgmma_persistent_kernel<PCfgCo128AddF8>)});
}

int device_sms() {
  const int sms = probed_sms();
  return sm_limit > 0 && sms > 0 ? std::min(sm_limit, sms) : sms;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A row-major (M, N) output as a TMA store / reduce-add target in (64 rows, 32 columns) boxes: the
// L2 promotion and out-of-bounds rule of every epilogue map; the element type and swizzle vary.
bool make_out_map_32(CUtensorMap* map, const void* y, CUtensorMapDataType type, int elem_bytes,
                     CUtensorMapSwizzle swizzle, int64_t M, int64_t N) {
  wgmma_ptx::EncodeTiled fn = wgmma_ptx::tensor_map_encoder();
  if (!fn) return false;
  cuuint64_t dims[2] = {cuuint64_t(N), cuuint64_t(M)};
  cuuint64_t strides[1] = {cuuint64_t(N) * cuuint64_t(elem_bytes)};  // bytes, a multiple of 16 (callers check N)
  cuuint32_t box[2] = {32, 64};
  cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = fn(map, type, 2, const_cast<void*>(y), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// The bf16 output in (64, 32) boxes with the 64B swizzle (config 6: 224 = 7 x 32 columns; config 4's
// 64-column boxes come from wgmma_make_map). N % 8 == 0.
bool make_store_map_32(CUtensorMap* map, const bf16* y, int64_t M, int64_t N) {
  return make_out_map_32(map, y, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, CU_TENSOR_MAP_SWIZZLE_64B, M, N);
}

// The fp32 add_f32 target as a TMA reduce-add destination (configs 9 / 10): 128-byte box rows, 128B
// swizzle. N % 4 == 0 and a 16-byte aligned base.
bool make_add_map_f32(CUtensorMap* map, const float* y, int64_t M, int64_t N) {
  return make_out_map_32(map, y, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, CU_TENSOR_MAP_SWIZZLE_128B, M, N);
}

// Config for a shape (the header's rule). 0 = v4 (one block per tile) where the 128x128 tiles fit in
// one round (tiles <= SMs: nothing to overlap, and v4's two warpgroups per 128x128 tile beat one
// ping-pong warpgroup per tile: o M = 512, 524 vs 466 TFLOP/s in run 1). Else the config with the
// least predicted time = rounds x tile area / main-loop rate, rounds = ceil(tiles / SMs), area in
// 128x128 units, rates relative to cooperative 128x256 as measured at M = 4096 (run 1: ping-pong
// 128x128 0.90, cooperative 128x192 0.93); 128x256 with the TMA-store epilogue where it can run.
// Session 9: with a bf16 output and M > 256 (prefill; batched decode keeps its measured choices),
// the 128x128 and 128x192 picks take their TMA-store twins (configs 7 / 8): at M = 512 they ran
// +6-9% over v4 / config 2 and +3% over ping-pong on gate_up (run 8, docs/performance/gemm.md).
// KILN_GEMM_TMA_STORE_SMALL=0 keeps the session-8 plan, for same-run comparison.
int plan(int64_t M, int64_t N, int sms, bool tma_epi) {
  constexpr double kRatePP = 0.90, kRate192 = 0.93;
  static const bool tma_small = env_switch_on("KILN_GEMM_TMA_STORE_SMALL");
  const bool twin = tma_epi && tma_small && M > 256;
  const int64_t m_tiles = ceil_div(M, P_BM);
  const int64_t t128 = m_tiles * ceil_div(N, 128);
  if (t128 <= sms) return twin ? 7 : 0;
  const double pp = double(ceil_div(t128, sms)) / kRatePP;
  const double co192 = 1.5 * double(ceil_div(m_tiles * ceil_div(N, 192), sms)) / kRate192;
  const double co256 = 2.0 * double(ceil_div(m_tiles * ceil_div(N, 256), sms));
  if (co256 <= pp && co256 <= co192) return tma_epi ? 4 : 3;
  if (co192 < pp) return twin ? 8 : 2;
  return twin ? 7 : 1;
}

}  // namespace

void gemm_persistent_set_sm_limit(int sms) { sm_limit = std::max(sms, 0); }

int gemm_wgmma_persistent_plan(int64_t M, int64_t N, int64_t K, bool bf16_out) {
  (void)K;
  const int sms = device_sms();
  return sms > 0 ? plan(M, N, sms, bf16_out) : 0;
}

bool gemm_wgmma_persistent(int config, const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode,
                           int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  if (!wgmma_shape_ok(x, w, M, N, K)) return false;
  mode = wgmma_epilogue_mode(mode);
  if (ceil_div(M, P_BM) * ceil_div(N, 128) >= (int64_t(1) << 31)) return false;  // int tile indices
  const int sms = device_sms();
  if (sms <= 0) return false;
  // The TMA-store epilogue needs a bf16 output whose rows are whole 16-byte units (N % 8 == 0) at a
  // 16-byte aligned base; elsewhere config 4 runs config 3 (the same tiles, register stores).
  const bool tma_epi = mode == OutMode::store_bf16 && N % 8 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  // Configs 9 / 10 (TMA reduce-add): an fp32 add_f32 target with 16-byte rows; else 3 / v4.
  const bool tma_add = (mode == OutMode::add_f32 || mode == kAddF32Serial) && N % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (config <= 0 || config > 10) {
    config = plan(M, N, sms, tma_epi);
    // A residual add (o, down) takes the same tiles with the TMA reduce-add epilogue: 128x256 for
    // config 3, 128x128 for a single round of v4 tiles (session 10, kernel_lab --gemm-add, same run:
    // o M = 512 35.2 -> 30.0 us, down M = 512 90.7 -> 84.2, o / down M = 2048 -3.3% / -2.3%,
    // M = 4096 -5.1% / -2.4%). KILN_GEMM_TMA_ADD=0: the register epilogue (the old plan).
    // Only where it was measured (prefill, M > 256, as the TMA-store twins) and not under
    // KILN_GEMM_ADD_BATCHED=0 (kAddF32Serial: that switch compares the register epilogues).
    static const bool tma_add_plan = env_switch_on("KILN_GEMM_TMA_ADD");
    if (tma_add && tma_add_plan && mode == OutMode::add_f32 && M > 256 && (config == 3 || config == 0))
      config = config == 3 ? 9 : 10;
    if (config == 0) return gemm_wgmma(x, w, bias, y, mode, M, N, K, stream);
  }
  if (config == 4 && !tma_epi) config = 3;
  if (config == 6 && !tma_epi) config = 5;
  if ((config == 7 || config == 8) && !tma_epi) config = config == 7 ? 0 : 2;  // 7: v4's register epilogue
  if ((config == 9 || config == 10) && !tma_add) config = config == 9 ? 3 : 0;
  CUtensorMap mx, my{};
  if (!wgmma_make_map(&mx, x, M, K, P_BM)) return false;
  if (config == 4 && !wgmma_make_map(&my, static_cast<const bf16*>(y), M, N, 64)) config = 3;
  if (config == 6 && !make_store_map_32(&my, static_cast<const bf16*>(y), M, N)) config = 5;
  if ((config == 7 || config == 8) && !wgmma_make_map(&my, static_cast<const bf16*>(y), M, N, 64))
    config = config == 7 ? 0 : 2;
  if ((config == 9 || config == 10) && !make_add_map_f32(&my, static_cast<const float*>(y), M, N))
    config = config == 9 ? 3 : 0;
  if (config == 0) return gemm_wgmma(x, w, bias, y, mode, M, N, K, stream);
  auto launch = [&](auto cfg) { launch_persistent<decltype(cfg)>(w, bias, y, mode, M, N, K, sms, stream, mx, my); };
  switch (config) {
    case 1: launch(PCfgPP128{}); break;
    case 2: launch(PCfgCo192{}); break;
    case 3: launch(PCfgCo256{}); break;
    case 5: launch(PCfgCo224{}); break;
    case 6: launch(PCfgCo224T{}); break;
    case 7: launch(PCfgCo128T{}); break;
    case 8: launch(PCfgCo192T{}); break;
    case 9: launch(PCfgCo256Add{}); break;
    case 10: launch(PCfgCo128Add{}); break;
    default: launch(PCfgCo256T{}); break;  // 4
  }
  return true;
}

bool gemm_wgmma_swiglu_can_run(const bf16* x, const bf16* w_gu, const bf16* h, int64_t M, int64_t inter, int64_t K) {
  constexpr int kOut = PCfgCo256TSwiglu::BN_OUT;
  if (!wgmma_shape_ok(x, w_gu, M, 2 * inter, K) || inter % kOut != 0 || reinterpret_cast<uintptr_t>(h) % 16 != 0)
    return false;
  if (ceil_div(M, P_BM) * (inter / kOut) >= (int64_t(1) << 31)) return false;
  const int sms = device_sms();
  // Only where the unfused gate/up GEMM would run the same 128x256 tiles (config 4): elsewhere
  // (ping-pong at M = 512, one round of v4 tiles) the plan measured another configuration faster.
  return sms > 0 && plan(M, 2 * inter, sms, true) == 4;
}

bool gemm_wgmma_swiglu(const bf16* x, const bf16* w_gu, bf16* h, int64_t M, int64_t inter, int64_t K,
                       cudaStream_t stream) {
  CUtensorMap mx, my;
  if (!wgmma_make_map(&mx, x, M, K, P_BM) || !wgmma_make_map(&my, h, M, inter, 64)) return false;
  launch_persistent<PCfgCo256TSwiglu>(w_gu, nullptr, h, OutMode::store_bf16, M, inter, K, device_sms(), stream, mx, my);
  return true;
}

bool gemm_wgmma_argmax_can_run(const bf16* x, const bf16* w, int64_t M, int64_t N, int64_t K) {
  // The epilogue's column ids are ints.
  if (!wgmma_shape_ok(x, w, M, N, K) || N >= (int64_t(1) << 31)) return false;
  if (ceil_div(M, P_BM) * ceil_div(N, 128) >= (int64_t(1) << 31)) return false;
  const int sms = device_sms();
  // Only where the store_f32 head would run the same 128x256 register-store tiles (config 3): the
  // same products, so the same ids as the argmax kernel over its logits.
  return sms > 0 && plan(M, N, sms, /*tma_epi=*/false) == 3;
}

bool gemm_wgmma_argmax(const bf16* x, const bf16* w, float2* parts, int64_t M, int64_t N, int64_t K,
                       cudaStream_t stream) {
  CUtensorMap mx, unused{};
  if (!wgmma_make_map(&mx, x, M, K, P_BM)) return false;
  launch_persistent<PCfgCo256Argmax>(w, nullptr, parts, OutMode::store_f32, M, N, K, device_sms(), stream, mx, unused);
  return true;
}

bool gemm_wgmma_rope_can_run(const bf16* x, const bf16* w, int64_t M, int64_t K, const RopeKvTarget& t) {
  const int hd = t.head_dim;
  const int64_t q_dim = int64_t(t.n_heads) * hd, kv_dim = int64_t(t.n_kv_heads) * hd, N = q_dim + 2 * kv_dim;
  constexpr int kCols = rope_epilogue::kTileCols;
  auto aligned = [](const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; };
  // Every tile inside q, k or v and whole heads in it; the epilogue's 16-byte loads and stores.
  if (!(hd == 64 || hd == 128 || hd == 256) || t.rot_dim != hd || q_dim % kCols != 0 || kv_dim % kCols != 0)
    return false;
  if (!t.position || !t.q_out || !aligned(t.q_out, 16) || t.kv.head_dim != hd) return false;
  // By slot (a pool), or by position into a contiguous cache (sequence 0), as rope_qkv.
  if (!t.slot && t.kv.paged()) return false;
  if (t.kv.quantized()) {
    if (!t.kv.k8 || !t.kv.v8 || !t.kv.k_scale || !t.kv.v_scale || !aligned(t.kv.k8, 8) || !aligned(t.kv.v8, 8))
      return false;
  } else if (!t.kv.k || !t.kv.v || !aligned(t.kv.k, 16) || !aligned(t.kv.v, 16) || t.kv.pos_stride % 8 != 0 ||
             (!t.kv.paged() && t.kv.seq_stride % 8 != 0)) {
    return false;
  }
  if (!wgmma_shape_ok(x, w, M, N, K) || ceil_div(M, P_BM) * (N / kCols) >= (int64_t(1) << 31)) return false;
  const int sms = device_sms();
  // Only where the plain qkv GEMM would run the same 128x256 staged tiles (config 4): the same products.
  return sms > 0 && plan(M, N, sms, /*tma_epi=*/true) == 4;
}

void gemm_wgmma_rope(const bf16* x, const bf16* w, const bf16* bias, const RopeKvTarget& t, int64_t M, int64_t K,
                     cudaStream_t stream) {
  const int64_t N = int64_t(t.n_heads + 2 * t.n_kv_heads) * t.head_dim;
  CUtensorMap mx, unused{};
  KILN_CUDA_REQUIRE(wgmma_make_map(&mx, x, M, K, P_BM), "gemm_wgmma_rope: tensor map");
  auto launch = [&](auto cfg) {
    launch_persistent<decltype(cfg)>(w, bias, nullptr, OutMode::store_bf16, M, N, K, device_sms(), stream, mx, unused,
                                     nullptr, nullptr, t);
  };
  switch (t.kv.quant) {
    case KvQuant::int8: launch(PCfgCo256TRope<KvQuant::int8>{}); break;
    case KvQuant::fp8: launch(PCfgCo256TRope<KvQuant::fp8>{}); break;
    default: launch(PCfgCo256TRope<KvQuant::none>{}); break;
  }
}

namespace {

// The fp8 operands' limits: as wgmma_shape_ok with K % 16 == 0 (16-byte rows of e4m3).
bool fp8_shape_ok(const uint8_t* xq, const uint8_t* w, int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0 || K % 16 != 0) return false;
  if ((reinterpret_cast<uintptr_t>(xq) | reinterpret_cast<uintptr_t>(w)) % 16 != 0) return false;
  if (M > (int64_t(1) << 31) - P_BM || N > (int64_t(1) << 31) - 256 || K > (int64_t(1) << 31) - 128) return false;
  return ceil_div(M, P_BM) * ceil_div(N, 128) < (int64_t(1) << 31);
}

// The fp8 configuration for a shape: the bf16 plan's tile (rounds x area / rate), always with the
// TMA epilogue (the fp8 main loop is twice as fast per tile, so the register store's fixed cost
// weighs twice as much): a store takes 128x128 (7), 128x192 (8) or 128x256 (4); a residual add
// 128x256 (9) where the plan takes 128x256, else 128x128 (10).
int plan_fp8(int64_t M, int64_t N, int sms, bool add) {
  const int p = plan(M, N, sms, /*tma_epi=*/true);
  const bool wide = p == 3 || p == 4;
  if (add) return wide ? 9 : 10;
  return wide ? 4 : (p == 2 || p == 8) ? 8 : 7;
}

}  // namespace

bool gemm_wgmma_fp8(int config, const uint8_t* xq, const float* xs, const uint8_t* w, const float* ws,
                    const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  if (!fp8_shape_ok(xq, w, M, N, K) || !xs || !ws || reinterpret_cast<uintptr_t>(y) % 16 != 0) return false;
  const bool store = mode == OutMode::store_bf16 && N % 8 == 0, add = mode == OutMode::add_f32 && N % 4 == 0;
  if (!store && !add) return false;
  const int sms = device_sms();
  if (sms <= 0) return false;
  if (config == 0) config = plan_fp8(M, N, sms, add);
  const bool config_adds = config == 9 || config == 10;
  if (config_adds != add || !(config == 4 || config == 7 || config == 8 || config_adds)) return false;
  CUtensorMap mx, my;
  if (!wgmma_make_map_e4m3(&mx, xq, M, K, P_BM)) return false;
  const bool mapped = add ? make_add_map_f32(&my, static_cast<const float*>(y), M, N)
                          : wgmma_make_map(&my, static_cast<const bf16*>(y), M, N, 64);
  if (!mapped) return false;
  auto launch = [&](auto cfg) {
    launch_persistent<decltype(cfg)>(w, bias, y, mode, M, N, K, sms, stream, mx, my, xs, ws);
  };
  switch (config) {
    case 4: launch(PCfgCo256TF8{}); break;
    case 7: launch(PCfgCo128TF8{}); break;
    case 8: launch(PCfgCo192TF8{}); break;
    case 9: launch(PCfgCo256AddF8{}); break;
    default: launch(PCfgCo128AddF8{}); break;  // 10
  }
  return true;
}

bool gemm_wgmma_fp8_swiglu_can_run(const uint8_t* xq, const uint8_t* w_gu, const bf16* h, int64_t M, int64_t inter,
                                   int64_t K) {
  constexpr int kOut = PCfgCo256TSwigluF8::BN_OUT;
  if (!fp8_shape_ok(xq, w_gu, M, 2 * inter, K) || inter % kOut != 0 || reinterpret_cast<uintptr_t>(h) % 16 != 0)
    return false;
  const int sms = device_sms();
  return sms > 0 && plan_fp8(M, 2 * inter, sms, false) == 4;  // the tiles the unfused product takes
}

bool gemm_wgmma_fp8_swiglu(const uint8_t* xq, const float* xs, const uint8_t* w_gu, const float* ws, bf16* h,
                           int64_t M, int64_t inter, int64_t K, cudaStream_t stream) {
  if (!xs || !ws) return false;  // the operands: as can_run accepted them (qmatmul's fp8_gemm_swiglu asks it)
  CUtensorMap mx, my;
  if (!wgmma_make_map_e4m3(&mx, xq, M, K, P_BM) || !wgmma_make_map(&my, h, M, inter, 64)) return false;
  launch_persistent<PCfgCo256TSwigluF8>(w_gu, nullptr, h, OutMode::store_bf16, M, inter, K, device_sms(), stream, mx,
                                        my, xs, ws);
  return true;
}

}  // namespace kiln::cuda
