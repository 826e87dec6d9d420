// Prefill GEMM on Hopper (sm_90a): y(M, N) = x(M, K) . W(N, K)^T with wgmma.mma_async + TMA.
// gemm.cu's version 4 (not the default yet: see gemm.cu). Same contract as gemm.cu: bf16 x and W
// row-major (K contiguous: both operands K-major, what wgmma wants with no transposes), fp32
// accumulation, result written per OutMode (+ bias), any M and N; needs K % 8 == 0 and 16-byte
// aligned x and W (the tensor maps' row stride and base), else the caller falls back to v2.
//
// Design: warp-specialized, "cooperative" (CUTLASS sm90 / FA3 style), one output tile per block.
//   Block = 3 warpgroups (384 threads). Warpgroup 0 is the producer: after setmaxnreg.dec to 40
//   registers, one thread issues TMA copies (cp.async.bulk.tensor.2d, tensor maps made on the host
//   with cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion: no -lcuda) of A (128, 64)
//   and B (BN, 64) into a STAGES-deep shared ring. Warpgroups 1 and 2 are consumers (setmaxnreg.inc
//   to 232): consumer c multiplies rows [64c, 64c + 64) of the tile by all BN columns with
//   wgmma m64nBNk16 (4 per 64-wide K step), accumulators in registers (BN / 2 floats per thread).
//   Ring protocol (mbarriers): full[s] (count 1: the producer's arrive.expect_tx of the stage's
//   bytes; the TMA completes the transaction) and empty[s] (count 2: one thread per consumer
//   warpgroup arrives once its wgmmas reading stage s have retired). Each consumer keeps one wgmma
//   group in flight: issue K step kt, wgmma.wait_group 1 (so step kt-1 is done), release kt-1.
//   Tails: TMA zero-fills the box outside (K, M) / (K, N), so M, N and K tails cost nothing in the
//   main loop (the transaction byte count is always the full box); the epilogue masks rows >= M and
//   columns >= N.
//   Two instantiations: BN = 256 (4 stages x 48 KB = 192 KB smem, 128 accumulators per consumer
//   thread) where the grid of 128x256 tiles fills the SMs, else BN = 128 (6 stages x 32 KB = 192 KB,
//   64 accumulators), e.g. M = 512 on N = 4096 (64 tiles of 128x256 on 132 SMs).
//   Grid: x over M tiles (fastest), y over N tiles: consecutive blocks share one W tile, so W (the
//   big operand: 1 GB for lm_head) streams from DRAM about once and x is re-read from L2.
//   Split-K (gemm_wgmma_splitk, for batched decode; matmul.h / gemm.cu): grid z over K slices of
//   k_tiles_per_split steps each; block z runs the same pipeline over its steps only (the ring and
//   its phases count from the slice's first step) and stores its fp32 partial, no bias, to slice z
//   of the workspace (y + z * M * N). Unsplit launches pass one slice of all steps: unchanged.
//
// Shared layout and descriptors (the part that must match bit for bit):
//   Each tile row is 64 bf16 = 128 bytes; TMA with CU_TENSOR_MAP_SWIZZLE_128B writes rows in order,
//   XORing the 16-byte chunk index (bits 4-6 of the address) with the row index mod 8 (bits 7-9),
//   within 1024-byte atoms of 8 rows; so every tile base is 1024-byte aligned. The wgmma matrix
//   descriptor (64 bits): start address >> 4 in bits 0-13; leading byte offset >> 4 in bits 16-29
//   (unused for swizzled K-major layouts: 1); stride byte offset >> 4 in bits 32-45 = 1024 >> 4
//   (distance between consecutive 8-row core groups); base offset bits 49-51 = 0 (1024-aligned
//   atoms); layout type bits 62-63 = 1 (128-byte swizzle). The k-th 16-wide K slice of the 64-wide
//   step starts 32 bytes further: descriptor + 2k (the hardware applies the swizzle to the computed
//   address, as CUTLASS / DeepGEMM do).
//
// wgmma m64nNk16 accumulator layout (f32, per warpgroup, thread t = 0..127, warp w = t / 32,
// lane l = t % 32): N / 2 floats d[0 .. N/2); d[4j + e] holds
//   row = 16w + l / 4 + 8 * (e >> 1),  col = 8j + 2 * (l % 4) + (e & 1),   j = 0 .. N/8 - 1.
// (The same per-warp pattern as mma.sync m16n8: warp w owns rows 16w .. 16w + 15.)
//
// Prediction (H200, Llama-3-8B shapes, bf16 out): 550-650 TFLOP/s at M >= 2048 (the tensor cores
// run the whole K loop from TMA-fed smem; what is left on the table vs cuBLAS is the non-persistent
// grid's wave tail and the epilogue stored straight from registers, not overlapped with the next
// tile's loads), ~400-450 at M = 512 (fewer tiles than 2 waves). Unmeasured: written without a GPU.
#include <cuda.h>  // CUtensorMap and its enums (types only; the driver entry point comes via cudart)
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/epilogue_add.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace kiln::cuda {
namespace {

constexpr int WG_BM = 128, WG_BK = 64, WG_THREADS = 384;  // 1 producer + 2 consumer warpgroups

template <int BN_, int STAGES_>
struct WgCfg {
  static constexpr int BN = BN_, STAGES = STAGES_;
  static constexpr int kABytes = WG_BM * WG_BK * 2;  // (128, 64) bf16 = 16 KB
  static constexpr int kBBytes = BN * WG_BK * 2;     // (BN, 64) bf16
  static constexpr int kStageBytes = kABytes + kBBytes;
  // STAGES x A, STAGES x B, then full[STAGES] and empty[STAGES] mbarriers; + 1 KB to align the base.
  static constexpr int kSmemBytes = STAGES * kStageBytes + 2 * STAGES * 8 + 1024;
  static_assert(BN == 128 || BN == 256, "wgmma n128 / n256");
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "1024-byte aligned swizzle atoms");
};
using WgCfg256 = WgCfg<256, 4>;  // 192 KB + barriers
using WgCfg128 = WgCfg<128, 6>;  // 192 KB + barriers

#ifdef KILN_WGMMA_DEVICE
using namespace wgmma_ptx;  // wgmma_bn<BN>: the m64nBNk16 instruction of a tile width
#endif  // KILN_WGMMA_DEVICE

template <class C>
__global__ void __launch_bounds__(WG_THREADS, 1)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                      const bf16* __restrict__ bias, void* __restrict__ y, OutMode mode, int64_t M, int64_t N,
                      int64_t K, int k_tiles_per_split, int64_t y_split_stride) {
#ifdef KILN_WGMMA_DEVICE
  constexpr int BN = C::BN, STAGES = C::STAGES, ACC = BN / 2;
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned base (the swizzle atoms); kSmemBytes has the slack.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sa0 = smem_u32(smem);                       // STAGES x A (128, 64), 16 KB each
  const uint32_t sb0 = sa0 + STAGES * C::kABytes;            // STAGES x B (BN, 64)
  const uint32_t full0 = sb0 + STAGES * C::kBBytes;          // STAGES x mbarrier (8 B)
  const uint32_t empty0 = full0 + STAGES * 8;                // STAGES x mbarrier
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int64_t m0 = int64_t(blockIdx.x) * WG_BM, n0 = int64_t(blockIdx.y) * BN;
  // Split-K (gemm_wgmma_splitk): block z covers the 64-wide K steps [kt0, kt0 + n_steps) and writes
  // its fp32 partial to slice z of the workspace y (store_f32, no bias); unsplit: gridDim.z = 1, all.
  // The ring counts steps from 0 in every block (stage i % STAGES, phase i / STAGES).
  const int kt0 = int(blockIdx.z) * k_tiles_per_split;
  const int n_steps = max(0, min(int((K + WG_BK - 1) / WG_BK) - kt0, k_tiles_per_split));
  if (blockIdx.z > 0) y = static_cast<float*>(y) + int64_t(blockIdx.z) * y_split_stride;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);   // the producer's arrive.expect_tx (+ the TMA transaction bytes)
      mbar_init(empty0 + 8 * s, 2);  // one arrival per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
      for (int kt = 0; kt < n_steps; ++kt) {
        const int s = kt % STAGES;
        const uint32_t use = uint32_t(kt / STAGES);
        const int k = (kt0 + kt) * WG_BK;
        mbar_wait(empty0 + 8 * s, (use & 1) ^ 1);  // consumers released this stage's previous use
        mbar_arrive_expect_tx(full0 + 8 * s, C::kStageBytes);
        tma_load_2d(sa0 + s * C::kABytes, &map_x, full0 + 8 * s, k, int(m0));  // (128, 64)
        tma_load_2d(sb0 + s * C::kBBytes, &map_w, full0 + 8 * s, k, int(n0));  // (BN, 64)
      }
    }
  } else {  // consumer c: tile rows [64c, 64c + 64)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1;
    float acc[ACC];  // (64, BN) per warpgroup, layout in the header
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;

    for (int kt = 0; kt < n_steps; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(full0 + 8 * s, uint32_t(kt / STAGES) & 1);  // stage s holds K step kt
      const uint64_t da = sw128_desc(sa0 + s * C::kABytes + c * 64 * 128);  // A rows (64, 64)
      const uint64_t db = sw128_desc(sb0 + s * C::kBBytes);                 // B (BN, 64)
      fence_acc<ACC>(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < WG_BK / 16; ++k) wgmma_bn<BN>(acc, da + 2 * k, db + 2 * k);  // +32 B per k16
      wgmma_commit();
      wgmma_wait<1>();  // K step kt-1's wgmmas have retired: its stage may be refilled
      fence_acc<ACC>(acc);
      if (kt > 0 && tid == 0) mbar_arrive(empty0 + 8 * ((kt - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_acc<ACC>(acc);

    // Epilogue straight from registers (epilogue_add.cuh: add_f32 with its reads batched).
    store_acc_block_batched<BN>(acc, tid, m0 + c * 64, n0, bias, y, mode, M, N);
  }
#else
  __trap();  // not built for sm_90a: the host never launches this (gemm_wgmma_available)
#endif
}

}  // namespace

// (rows, K) row-major bf16 -> tensor map with (64, box_rows) boxes, 128-byte swizzle, zero fill.
namespace {
// A K-major (rows, K) operand in (128 bytes of K, box_rows) boxes, 128-byte swizzle, zero fill past
// its edges: what every wgmma ring loads, whatever the element width.
bool make_kmajor_map(CUtensorMap* map, const void* p, CUtensorMapDataType type, int elem_bytes, int64_t rows,
                     int64_t K, int box_rows) {
  wgmma_ptx::EncodeTiled fn = wgmma_ptx::tensor_map_encoder();
  if (!fn) return false;
  cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  cuuint64_t strides[1] = {cuuint64_t(K) * cuuint64_t(elem_bytes)};  // bytes, multiple of 16 (callers check K)
  cuuint32_t box[2] = {cuuint32_t(128 / elem_bytes), cuuint32_t(box_rows)};
  cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = fn(map, type, 2, const_cast<void*>(p), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}
}  // namespace

bool wgmma_make_map(CUtensorMap* map, const bf16* p, int64_t rows, int64_t K, int box_rows) {
  static_assert(WG_BK * 2 == 128, "a K step is one 128-byte swizzle row");
  return make_kmajor_map(map, p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, K, box_rows);
}

bool wgmma_make_map_e4m3(CUtensorMap* map, const uint8_t* p, int64_t rows, int64_t K, int box_rows) {
  return make_kmajor_map(map, p, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, K, box_rows);
}

namespace {

template <class C>
void launch_wgmma(const CUtensorMap& mx, const CUtensorMap& mw, const bf16* bias, void* y, OutMode mode, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream, int splits = 1, int k_tiles_per_split = 0) {
  static bool configured = false;  // raising the dynamic shared-memory limit once is enough
  if (!configured) {
    KILN_CUDA_CHECK(
        cudaFuncSetAttribute(gemm_wgmma_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    configured = true;
  }
  const int k_tiles = int((K + WG_BK - 1) / WG_BK);
  if (splits <= 1) {
    splits = 1;
    k_tiles_per_split = k_tiles;
  }
  dim3 grid(unsigned((M + WG_BM - 1) / WG_BM), unsigned((N + C::BN - 1) / C::BN), unsigned(splits));
  gemm_wgmma_kernel<C><<<grid, WG_THREADS, C::kSmemBytes, stream>>>(mx, mw, bias, y, mode, M, N, K,
                                                                    k_tiles_per_split, M * N);
  KILN_CUDA_CHECK_LAUNCH();
}

struct DeviceInfo {
  bool ok = false;
  int sms = 0;
};

DeviceInfo device_info() {
  static wgmma_ptx::HopperProbe probe;
  const int sms = probe.sms(std::max(WgCfg256::kSmemBytes, WgCfg128::kSmemBytes),
                            {reinterpret_cast<const void*>(gemm_wgmma_kernel<WgCfg256>),
                             reinterpret_cast<const void*>(gemm_wgmma_kernel<WgCfg128>)});
  return {sms > 0, sms};
}

}  // namespace

bool gemm_wgmma_available() { return device_info().ok; }

// The shape / alignment limits of the entry points (tensor maps, int coordinates, grid.y).
bool wgmma_shape_ok(const bf16* x, const bf16* w, int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0 || K % 8 != 0) return false;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 != 0) return false;
  if (M > (int64_t(1) << 31) - WG_BM || N > (int64_t(1) << 31) - 256 || K > (int64_t(1) << 31) - WG_BK) return false;
  if ((M + WG_BM - 1) / WG_BM >= (int64_t(1) << 31) || (N + 127) / 128 >= 65536) return false;
  return true;
}

int gemm_wgmma_sms() { return device_info().sms; }

bool gemm_wgmma_splitk(const bf16* x, const bf16* w, float* partials, int64_t M, int64_t N, int64_t K, int splits,
                       int k_steps_per_split, cudaStream_t stream) {
  if (!wgmma_shape_ok(x, w, M, N, K) || splits < 1 || splits > 65535 || k_steps_per_split < 1) return false;
  if (int64_t(splits - 1) * k_steps_per_split >= (K + WG_BK - 1) / WG_BK) return false;  // an empty slice
  if (!device_info().ok) return false;
  CUtensorMap mx, mw;
  if (!wgmma_make_map(&mx, x, M, K, WG_BM) || !wgmma_make_map(&mw, w, N, K, 128)) return false;
  launch_wgmma<WgCfg128>(mx, mw, nullptr, partials, OutMode::store_f32, M, N, K, stream, splits, k_steps_per_split);
  return true;
}

bool gemm_wgmma(const bf16* x, const bf16* w, const bf16* bias, void* y, OutMode mode, int64_t M, int64_t N,
                int64_t K, cudaStream_t stream) {
  if (!wgmma_shape_ok(x, w, M, N, K)) return false;
  mode = wgmma_epilogue_mode(mode);
  DeviceInfo dev = device_info();
  if (!dev.ok) return false;
  // 128x256 tiles when they make at least one full wave, else 128x128 (twice the blocks).
  const int64_t tiles256 = ((M + WG_BM - 1) / WG_BM) * ((N + 255) / 256);
  const bool wide = tiles256 >= dev.sms;
  CUtensorMap mx, mw;
  if (!wgmma_make_map(&mx, x, M, K, WG_BM) || !wgmma_make_map(&mw, w, N, K, wide ? 256 : 128)) return false;
  if (wide)
    launch_wgmma<WgCfg256>(mx, mw, bias, y, mode, M, N, K, stream);
  else
    launch_wgmma<WgCfg128>(mx, mw, bias, y, mode, M, N, K, stream);
  return true;
}

}  // namespace kiln::cuda
