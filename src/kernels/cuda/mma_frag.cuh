// Register-level helpers of the GEMVs (gemv.cu, quant/): the 16-byte streaming weight load, the m16n8k16
// MMAs (bf16 and f16) and the bit tricks that turn packed integers / e4m3 bytes into MMA operands.
#pragma once

#include <cuda_fp16.h>

#include "kernels/cuda/common.h"

namespace kiln::cuda::qk {

// 16 weight bytes read once: no L1 allocation; .L2::256B fetches the whole 256-byte span, which the
// quad's next pieces of the same row read next (as gemv.cu's ld_weight).
__device__ __forceinline__ uint4 ld_weight(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// ld_weight with the L2 fetch span chosen at run time (qgemv v3's KILN_QGEMV_LD_SPAN, session 42, whose
// 64-byte requests a row lose part of a 256-byte span in a full L2): 256 as ld_weight, 128 or 64 bytes,
// or 0 (no hint: the sectors asked for). A uniform branch a load.
__device__ __forceinline__ uint4 ld_weight_span(const void* p, int span) {
  if (span == 256) return ld_weight(p);
  uint4 v;
  if (span == 128)
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else if (span == 64)
    asm volatile("ld.global.nc.L1::no_allocate.L2::64B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;  // j is a compile-time constant after unrolling
}

// c += A(16x16) . B(16x8), bf16 operands, fp32 accumulators (PTX fragment order: a0 = rows g, k 2t..;
// a1 = rows g + 8; a2 / a3 = the same rows at k + 8; b0 / b1 = column g at k 2t.. / 2t + 8..).
__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d = A . B with a zero accumulator (ptxas passes RZ: no clearing instructions), bf16 / fp16 operands.
__device__ __forceinline__ void mma_bf16_z(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}
__device__ __forceinline__ void mma_f16_z(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// Two nibbles (bits shift..shift+3 and shift+16..shift+19) as a bf16 pair base + nibble * step: base
// 0x4300 = 128.0 (mantissa step 1), 0x4500 = 2048.0 (step 16). Exact; one SHF + one LOP3.
template <int kShift, uint32_t kBase>
__device__ __forceinline__ uint32_t nibble_pair(uint32_t w) {
  return ((w >> kShift) & 0x000F000Fu) | kBase;
}
constexpr uint32_t kBf16Ones = 0x3F803F80u;  // (1.0, 1.0): the A operand that sums x over k

// Two e4m3 bytes (low byte first) -> f16x2, exact (every e4m3 value is an f16 value).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n.reg .b16 lo;\ncvt.u16.u32 lo, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(r) : "r"(two_bytes));
#else
  // sm_80: sign to bit 15, exponent/mantissa to bits 7..13 gives value * 2^-8; scale back in f16.
  uint32_t t = (two_bytes & 0xFFu) | ((two_bytes & 0xFF00u) << 8);
  t = (t + (t & 0x00800080u)) << 7;
  __half2 h = *reinterpret_cast<__half2*>(&t);
  h = __hmul2(h, __half2(__float2half(256.0f), __float2half(256.0f)));
  r = *reinterpret_cast<uint32_t*>(&h);
#endif
  return r;
}

// Four e4m3 bytes -> f16 pairs (b0, b1) and (b2, b3), exact. On sm_89+ the word's halves go to the
// conversion as 16-bit halves of the same register (no shift or mask to take them out first).
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  lo = e4m3x2_to_f16x2(w & 0xFFFFu);
  hi = e4m3x2_to_f16x2(w >> 16);
#endif
}

}  // namespace kiln::cuda::qk
