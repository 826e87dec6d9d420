// Device helpers of the quantized KV cache (kv_quant.h): the per-vector scale, the byte encoding,
// and the exact conversion of bytes to bf16 the decode kernel feeds to the tensor cores.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda::kvq {

// scale and its inverse from the vector's amax, as quant::fake_quantize computes them (fp32, IEEE
// division). A non-finite amax gives a NaN scale, so the vector reads back as NaN (visible), where
// the CPU reference leaves it unquantized.
template <KvQuant F>
__device__ __forceinline__ void scale_of(float amax, float& scale, float& inv) {
  if (!(amax > 0.0f) || !isfinite(amax)) {
    scale = amax == 0.0f ? 0.0f : __int_as_float(0x7fffffff);
    inv = 0.0f;
    return;
  }
  if constexpr (F == KvQuant::int8) {
    scale = __fdiv_rn(amax, 127.0f);
    inv = __fdiv_rn(1.0f, scale);
  } else {
    scale = __fdiv_rn(amax, 448.0f);
    inv = __fdiv_rn(448.0f, amax);
  }
}

template <KvQuant F>
__device__ __forceinline__ uint8_t encode(float x, float inv) {
  const float y = __fmul_rn(x, inv);
  if constexpr (F == KvQuant::int8) {
    return uint8_t(int8_t(fminf(fmaxf(rintf(y), -127.0f), 127.0f)));
  } else {
    return uint8_t(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
  }
}

// The max of v over this lane's aligned group of `group` lanes (a power of two up to 32); every
// lane of the warp calls it with its own group size (the shuffles are warp-wide). The 16-byte
// quantizing K/V writes' per-vector amax (kv_quant_vec.cu, gemm_rope_epilogue.cuh).
__device__ __forceinline__ float group_max(float v, int group) {
  float r = v;
#pragma unroll
  for (int w = 1; w < 32; w *= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, r, w);
    if (w < group) r = fmaxf(r, o);
  }
  return r;
}

// Eight values encoded with the vector's inverse scale: 8 bytes in memory order.
template <KvQuant F>
__device__ __forceinline__ uint2 encode8(const float* x, float inv) {
  uint2 r{0u, 0u};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    r.x |= uint32_t(encode<F>(x[e], inv)) << (8 * e);
    r.y |= uint32_t(encode<F>(x[4 + e], inv)) << (8 * e);
  }
  return r;
}

// The byte's value before the scale (fp32).
template <KvQuant F>
__device__ __forceinline__ float decode(uint8_t b) {
  if constexpr (F == KvQuant::int8) {
    return float(int8_t(b));
  } else {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E4M3)));
  }
}

// Four bytes (one 32-bit word, bytes b0..b3 in memory order) -> bf16 pairs (b0, b1) and (b2, b3),
// exactly (int8 values and every e4m3 value are bf16 numbers), with integer and bf16x2 operations
// only: the conversion unit (I2F/F2F, 16 results per clock per SM on Hopper) would cap the decode
// kernel below the memory bandwidth.
//   int8: with the byte in the low half of a 16-bit lane, 0x4300 | (x & 0x7f) is the bf16 128 + (x & 0x7f)
//         and 0x4300 | (x & 0x80) is 128 or 256; their difference is x (two's complement).
//   fp8:  e4m3 s.eeee.mmm -> bf16 bits s.0000eeee.mmm0000 is the value times 2^-120 (subnormals
//         included); one bf16x2 multiply by 2^120 restores it.
template <KvQuant F>
__device__ __forceinline__ void bytes_to_bf16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t x01 = __byte_perm(w, 0u, 0x4140), x23 = __byte_perm(w, 0u, 0x4342);
  auto one = [](uint32_t x) {
    __nv_bfloat162 r;
    if constexpr (F == KvQuant::int8) {
      const uint32_t a = (x & 0x007f007fu) | 0x43004300u, b = (x & 0x00800080u) | 0x43004300u;
      r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
    } else {
      const uint32_t bits = ((x & 0x00800080u) << 8) | ((x & 0x007f007fu) << 4), k = 0x7b807b80u;  // 2^120
      r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits), *reinterpret_cast<const __nv_bfloat162*>(&k));
    }
    return *reinterpret_cast<uint32_t*>(&r);
  };
  lo = one(x01);
  hi = one(x23);
}

// The quantizing K/V writes' four kernels (by slot or by position, int8 or fp8) picked in one place:
// launch(kSlots, kQuant) with the runtime choice as std::bool_constant and
// std::integral_constant<KvQuant, ...> (rope_qkv_quant, rope_qkv_quant_vec).
template <class Launch>
void with_write_form(bool by_slot, KvQuant quant, Launch&& launch) {
  auto in_format = [&](auto slots) {
    if (quant == KvQuant::int8)
      launch(slots, std::integral_constant<KvQuant, KvQuant::int8>{});
    else
      launch(slots, std::integral_constant<KvQuant, KvQuant::fp8>{});
  };
  if (by_slot)
    in_format(std::true_type{});
  else
    in_format(std::false_type{});
}

}  // namespace kiln::cuda::kvq
