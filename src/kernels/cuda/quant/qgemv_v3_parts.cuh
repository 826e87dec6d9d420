// The device helpers of qgemv_v3.cu (and of the decode megakernel, which multiplies the same operand
// forms from shared memory): the MMA forms, the bit tricks that turn packed int4 / int8 codes into
// MMA operands, the shared-memory loads, the per-format super-chunk shapes and scale layouts, the
// fp16(x / 16) form of x for int8, and the fold of a unit's MMA sums into the fp32 result.
#pragma once

#include <cuda_fp16.h>

#include "kernels/cuda/mma_frag.cuh"
#include "model/quantized_matrix.h"

namespace kiln::cuda {
namespace {

using namespace qk;

// c = A . B when First (a zero accumulator), else c += A . B; bf16 operands, or fp16 with Half.
template <bool First, bool Half = false>
__device__ __forceinline__ void mma_acc(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  if constexpr (First && Half)
    mma_f16_z(c, a0, a1, a2, a3, b0, b1);
  else if constexpr (First)
    mma_bf16_z(c, a0, a1, a2, a3, b0, b1);
  else if constexpr (Half)
    mma_f16(c, a0, a1, a2, a3, b0, b1);
  else
    mma_bf16(c, a0, a1, a2, a3, b0, b1);
}

// int8 with x in shared memory (session 13): bytes b_i and b_j of w as the fp16 pair (1024 + b_i,
// 1024 + b_j), exact (fp16 has 10 mantissa bits), in one PRMT against the exponent byte 0x64. bf16
// (7 bits) cannot hold a byte, which is why the bf16 path splits every byte into two nibbles and
// runs two MMAs per word pair; ncu (session 13) showed that int8 stream issue-bound (IPC 1.9,
// 133 instructions per KB of weights) at 60% of the DRAM peak where bf16's waits on memory.
template <uint32_t kSelect>
__device__ __forceinline__ uint32_t byte_pair_f16(uint32_t w) {
  return __byte_perm(w, 0x64646464u, kSelect);
}
// x is staged for it as fp16(x / 16): a bf16 value of magnitude 2^-13 (1.2e-4) up to 2^20 (1.05e6)
// is exact there (bf16's 8 significant bits fit fp16's 11); smaller ones round to fp16's subnormal
// step (at most 4.8e-7 off, in x's units: about bf16's own rounding at 1.2e-4); from 2^20 on the
// conversion gives inf and the row's outputs NaN. With the folded RMSNorm, x is the residual times
// the norm weight, not normalized: Llama-family residuals stay below ~1e4, two decades inside.
// (`KILN_QGEMV_INT8_F16=0` runs the bf16 nibble path, which has no such bound.)
constexpr float kF16XScale = 0.0625f;

// One 16-byte piece of x in that form: f (its 8 values) becomes the fp16(x / 16) values the MMAs
// see, back in fp32 (the x sums are taken from these), and the packed halves are returned.
__device__ __forceinline__ uint4 f16_over16_piece(float (&f)[8]) {
  uint32_t h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const __half2 p = __floats2half2_rn(f[2 * e] * kF16XScale, f[2 * e + 1] * kF16XScale);
    const float2 back = __half22float2(p);
    f[2 * e] = back.x;
    f[2 * e + 1] = back.y;
    h[e] = *reinterpret_cast<const uint32_t*>(&p);
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// ((w >> kShift) & 0x000F000F) | kBase in one LOP3 (+ one SHF): written as C, the compiler emits two
// LOP3s (one immediate per LOP3), 11 instructions per word instead of 7 (SASS of the first v3 build).
template <int kShift, uint32_t kBase>
__device__ __forceinline__ uint32_t pair(uint32_t w) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(w >> kShift), "n"(0x000F000Fu), "n"(kBase));
  return r;
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 lds64f(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

template <QuantFormat F>
struct V3Format;
template <>
struct V3Format<QuantFormat::int4> {
  static constexpr int KS = 128;  // k per super-chunk
  static constexpr int XL = 4;    // 16-byte activation pieces per super-chunk and lane
  static constexpr int NG = 4;    // groups of 32 per super-chunk
};
template <>
struct V3Format<QuantFormat::int8> {
  static constexpr int KS = 64;
  static constexpr int XL = 2;
  static constexpr int NG = 2;
};

// Where a super-chunk's scales come from (one float2 {scale, min'} per row and lane):
//   kG32:   groups of 32: lane t holds group t % NG of the super-chunk, the quad's other lanes get it
//           by shuffles at the fold (4 registers per ring slot instead of 4 NG);
//   kShift: group = KS << shift: group index sc >> shift;
//   kRow:   one group per row (group = K): loaded once when a block runs one tile, else with each
//           super-chunk as kShift.
enum ScaleMode { kG32 = 0, kShift = 1, kRow = 2 };

// k per fold unit (and per x sum): a group of 32, else a super-chunk (the kernel's UNIT, and the
// host's shared-memory sizes).
constexpr int v3_fold_unit(QuantFormat f, int scale_mode) {
  return scale_mode == kG32 ? 32 : f == QuantFormat::int4 ? V3Format<QuantFormat::int4>::KS
                                                          : V3Format<QuantFormat::int8>::KS;
}

// Lane (g, t)'s float2 from lane (g, u) of its quad.
__device__ __forceinline__ float2 quad_shfl(float2 v, int u) {
  const int src = (threadIdx.x & 28) | u;
  return make_float2(__shfl_sync(0xffffffffu, v.x, src), __shfl_sync(0xffffffffu, v.y, src));
}

// acc += scale * q + min' * xsum per accumulator element (rows g / g + 8: s_lo / s_hi; activation
// rows 2t, 2t + 1 of the n-tile: xs.x / xs.y).
__device__ __forceinline__ void fold4(float (&acc)[4], const float (&q)[4], float2 s_lo, float2 s_hi, float2 xs) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 sc = e < 2 ? s_lo : s_hi;
    acc[e] = fmaf(sc.x, q[e], fmaf(sc.y, (e & 1) ? xs.y : xs.x, acc[e]));
  }
}

// Shared memory of a block (dynamic): sum(x) per (fold unit, activation row 0 .. 8 NT - 1), then
// (XS) the activation rows < M, each 2K + 64 bytes (the 64-byte pad puts rows g and g + 1 on
// different banks for the quads' 16-byte loads).
__host__ __device__ constexpr int64_t v3_row_stride(int64_t K) { return 2 * K + 64; }

}  // namespace
}  // namespace kiln::cuda
