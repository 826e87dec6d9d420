// Prefill GEMM with fp8 weights and activations on Hopper (sm_90a), W8A8:
//   y[m, n] = scale_x[m] * scale_w[n] * sum_k e4m3(xq[m, k]) * e4m3(wq[n, k])  (+ bias[n]),
// xq / scale_x from fp8_quantize_rows (act_quant.cu), W row-major e4m3 with one scale per row.
//
// The bf16 wgmma + TMA GEMM (gemm_wgmma.cu, whose design notes apply unchanged) with fp8 operands:
// both are K-major, which is the only layout wgmma takes for 8-bit types, and the shared-memory
// tiles keep their shape in bytes: a K step is 128 e4m3 values = 128 bytes per row (the 128-byte
// swizzle atom), A (128, 128) = 16 KB and B (BN, 128) = BN * 128 bytes, so the ring (4 stages at
// BN = 256, 6 at BN = 128), the mbarrier protocol and the descriptors are byte for byte those of the
// bf16 kernel; each K step runs 4 wgmma m64nBNk32 (the 32-byte K slices at descriptor + 2k). Half the
// bytes per FLOP and twice the tensor-core rate: per K step the same smem traffic does 2x the FLOPs.
// The epilogue multiplies the fp32 accumulator by scale_x[row] * scale_w[col] before the usual
// OutMode store (the products of two e4m3 values are exact in the fp32 accumulation, as on the CPU).
// Prediction (H200): 2x the bf16 kernel's 600-780 TFLOP/s minus the epilogue, ~1000-1300 TFLOP/s at
// M >= 2048 (cuBLAS fp8 ~1400 measured via torch._scaled_mm); prefill is then ~65% GEMM at bf16, so
// pp2048 ~1.4-1.6x of bf16 with the activation quantization (~3 bytes per activation) added.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace kiln::cuda {
namespace {

constexpr int F8_BM = 128, F8_BK = 128, F8_THREADS = 384;  // BK in elements = bytes

template <int BN_, int STAGES_>
struct F8Cfg {
  static constexpr int BN = BN_, STAGES = STAGES_;
  static constexpr int kABytes = F8_BM * F8_BK;  // 16 KB
  static constexpr int kBBytes = BN * F8_BK;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes + 2 * STAGES * 8 + 1024;
  static_assert(BN == 128 || BN == 256, "wgmma n128 / n256");
};
using F8Cfg256 = F8Cfg<256, 4>;
using F8Cfg128 = F8Cfg<128, 6>;

#ifdef KILN_WGMMA_DEVICE
using namespace wgmma_ptx;

#endif  // KILN_WGMMA_DEVICE

template <class C>
__global__ void __launch_bounds__(F8_THREADS, 1)
    fp8_gemm_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                    const float* __restrict__ xs, const float* __restrict__ ws, const bf16* __restrict__ bias,
                    void* __restrict__ y, OutMode mode, int64_t M, int64_t N, int64_t K) {
#ifdef KILN_WGMMA_DEVICE
  constexpr int BN = C::BN, STAGES = C::STAGES, ACC = BN / 2;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sa0 = smem_u32(smem);
  const uint32_t sb0 = sa0 + STAGES * C::kABytes;
  const uint32_t full0 = sb0 + STAGES * C::kBBytes;
  const uint32_t empty0 = full0 + STAGES * 8;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int64_t m0 = int64_t(blockIdx.x) * F8_BM, n0 = int64_t(blockIdx.y) * BN;
  const int n_steps = int((K + F8_BK - 1) / F8_BK);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 2);
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
        mbar_wait(empty0 + 8 * s, (use & 1) ^ 1);
        mbar_arrive_expect_tx(full0 + 8 * s, C::kStageBytes);
        tma_load_2d(sa0 + s * C::kABytes, &map_x, full0 + 8 * s, kt * F8_BK, int(m0));
        tma_load_2d(sb0 + s * C::kBBytes, &map_w, full0 + 8 * s, kt * F8_BK, int(n0));
      }
    }
  } else {  // consumer c: tile rows [64c, 64c + 64)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1;
    float acc[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;

    for (int kt = 0; kt < n_steps; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(full0 + 8 * s, uint32_t(kt / STAGES) & 1);
      const uint64_t da = sw128_desc(sa0 + s * C::kABytes + c * 64 * 128);
      const uint64_t db = sw128_desc(sb0 + s * C::kBBytes);
      fence_acc<ACC>(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < F8_BK / 32; ++k) wgmma_bn_e4m3<BN>(acc, da + 2 * k, db + 2 * k);  // +32 B per k32
      wgmma_commit();
      wgmma_wait<1>();
      fence_acc<ACC>(acc);
      if (kt > 0 && tid == 0) mbar_arrive(empty0 + 8 * ((kt - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_acc<ACC>(acc);

    // d[4j + e] is (row 16w + l/4 + 8(e>>1), col 8j + 2(l%4) + (e&1)), as in gemm_wgmma.cu.
    const int w = tid / 32, l = tid % 32;
    const int64_t r_base = m0 + c * 64 + w * 16 + l / 4;
    const bool pairs = (N & 1) == 0;
    float sx[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) sx[h] = r_base + 8 * h < M ? xs[r_base + 8 * h] : 0.0f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int64_t col = n0 + j * 8 + 2 * (l % 4);
      if (col >= N) continue;
      const bool has_c1 = col + 1 < N;
      const float w0 = ws[col], w1 = has_c1 ? ws[col + 1] : 0.0f;
      const float b0 = bias ? __bfloat162float(bias[col]) : 0.0f;
      const float b1 = bias && has_c1 ? __bfloat162float(bias[col + 1]) : 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = r_base + 8 * h;
        if (r >= M) continue;
        const float v0 = acc[4 * j + 2 * h] * sx[h] * w0 + b0, v1 = acc[4 * j + 2 * h + 1] * sx[h] * w1 + b1;
        if (pairs && has_c1) {
          store_out2(y, mode, r * N + col, v0, v1);
        } else {
          store_out(y, mode, r * N + col, v0);
          if (has_c1) store_out(y, mode, r * N + col + 1, v1);
        }
      }
    }
  }
#else
  __trap();  // not built for sm_90a: the host never launches this (fp8_gemm_available)
#endif
}

template <class C>
void launch(const CUtensorMap& mx, const CUtensorMap& mw, const float* xs, const float* ws, const bf16* bias, void* y,
            OutMode mode, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  static bool configured = false;
  if (!configured) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(fp8_gemm_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    configured = true;
  }
  dim3 grid(unsigned((M + F8_BM - 1) / F8_BM), unsigned((N + C::BN - 1) / C::BN));
  fp8_gemm_kernel<C><<<grid, F8_THREADS, C::kSmemBytes, stream>>>(mx, mw, xs, ws, bias, y, mode, M, N, K);
  KILN_CUDA_CHECK_LAUNCH();
}

struct Avail {
  bool ok = false;
  int sms = 0;
};

// As the bf16 GEMM's device_info (wgmma_ptx::HopperProbe).
Avail availability() {
  static wgmma_ptx::HopperProbe probe;
  const int sms = probe.sms(std::max(F8Cfg256::kSmemBytes, F8Cfg128::kSmemBytes),
                            {reinterpret_cast<const void*>(fp8_gemm_kernel<F8Cfg256>),
                             reinterpret_cast<const void*>(fp8_gemm_kernel<F8Cfg128>)});
  return {sms > 0, sms};
}

}  // namespace

bool fp8_gemm_available() { return availability().ok; }

bool fp8_gemm(const uint8_t* xq, const float* xs, const QWeight& w, const bf16* bias, void* y, OutMode mode, int64_t M,
              cudaStream_t stream, int version) {
  const int64_t N = w.rows, K = w.cols;
  if (w.format != QuantFormat::fp8 || M <= 0 || N <= 0 || K <= 0 || K % 16 != 0) return false;
  // Session 11: the persistent GEMM's fp8 configurations (TMA-store / reduce-add epilogues) first
  // from kFp8PersistentMinRows rows; this file's one-tile-per-block kernel for fewer rows, for the
  // outputs they do not take (store_f32, odd N) and under KILN_FP8_PERSISTENT=0 (the same-run
  // comparison).
  static const bool persistent = env_switch_on("KILN_FP8_PERSISTENT");
  if ((version == 2 || (version == 0 && persistent && M >= kFp8PersistentMinRows)) &&
      gemm_wgmma_fp8(0, xq, xs, static_cast<const uint8_t*>(w.data), w.scales, bias, y, mode, M, N, K, stream))
    return true;
  if (version == 2) return false;
  if ((reinterpret_cast<uintptr_t>(xq) | reinterpret_cast<uintptr_t>(w.data)) % 16 != 0) return false;
  if (M >= (int64_t(1) << 31) - F8_BM || N >= (int64_t(1) << 31) - 256 || (N + 127) / 128 >= 65536) return false;
  const Avail dev = availability();
  if (!dev.ok) return false;
  const int64_t tiles256 = ((M + F8_BM - 1) / F8_BM) * ((N + 255) / 256);
  const bool wide = tiles256 >= dev.sms;
  CUtensorMap mx, mw;
  if (!wgmma_make_map_e4m3(&mx, xq, M, K, F8_BM) ||
      !wgmma_make_map_e4m3(&mw, static_cast<const uint8_t*>(w.data), N, K, wide ? 256 : 128))
    return false;
  if (wide)
    launch<F8Cfg256>(mx, mw, xs, w.scales, bias, y, mode, M, N, K, stream);
  else
    launch<F8Cfg128>(mx, mw, xs, w.scales, bias, y, mode, M, N, K, stream);
  return true;
}

}  // namespace kiln::cuda
