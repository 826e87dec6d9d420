// The quantized KV cache's write (RoPE + quantize) and its dequantization for prefill (kv_quant.h).
#include "kernels/cuda/kv_quant.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pointwise_math.cuh"

namespace kiln::cuda {
namespace {

// One block per token, one warp per head (q heads, then k heads, then v heads): a head's vector is
// a warp's, so its amax is a warp reduction. The warp puts the head's fp32 values (rotated for q
// and k, as rope_qkv rotates them) in shared memory, then each lane quantizes 4 consecutive values
// and stores them as one 32-bit word. q goes out in bf16 as rope_qkv writes it. Unlike the bf16
// path, K is quantized from the fp32 rotation, not from its bf16 rounding.
constexpr int kQuantWarps = 16;  // 48 heads of Llama-3-8B: 3 rounds (8 warps: 6, 1.2 us slower a call)
template <bool kSlots, KvQuant F>
__global__ void __launch_bounds__(kQuantWarps * 32)
    rope_qkv_quant_kernel(const bf16* __restrict__ qkv, const int32_t* __restrict__ positions,
                          const int32_t* __restrict__ slots, const float* __restrict__ inv_freq,
                          const float2* __restrict__ cos_sin, int64_t cos_sin_positions, int rot_dim, bool interleaved,
                          int n_heads, int n_kv_heads, int head_dim, bf16* __restrict__ q_out, KvLayout kv) {
  __shared__ float vals[kQuantWarps][128];
  pdl_wait();  // qkv comes from the GEMV before this kernel
  pdl_launch_dependents();
  const int t = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
  const bf16* row = qkv + int64_t(t) * (q_dim + 2 * kv_dim);  // [q | k | v]
  const int64_t pos = positions[t];
  const int half = rot_dim / 2;
  float* const v = vals[warp];
  for (int h = warp; h < n_heads + 2 * n_kv_heads; h += kQuantWarps) {
    const bf16* src = row + int64_t(h) * head_dim;  // q, k and v heads are consecutive in the row
    const bool rotate = h < n_heads + n_kv_heads;
    if (rotate) {
      for (int i = lane; i < half; i += 32) {
        float s, c;
        rope_sincos_cached(cos_sin, cos_sin_positions, half, pos, i, inv_freq, s, c);
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        const float x0 = __bfloat162float(src[a]), x1 = __bfloat162float(src[b]);
        v[a] = rope_a(x0, x1, s, c);
        v[b] = rope_b(x0, x1, s, c);
      }
    }
    for (int d = rotate ? rot_dim + lane : lane; d < head_dim; d += 32) v[d] = __bfloat162float(src[d]);
    __syncwarp();
    if (h < n_heads) {
      bf16* qo = q_out + int64_t(t) * q_dim + int64_t(h) * head_dim;
      for (int d = lane; d < head_dim; d += 32) qo[d] = __float2bfloat16(v[d]);
    } else {
      const bool is_k = h < n_heads + n_kv_heads;
      const int kvh = is_k ? h - n_heads : h - n_heads - n_kv_heads;
      float amax = 0.0f;
      for (int d = lane; d < head_dim; d += 32) amax = fmaxf(amax, fabsf(v[d]));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      float scale, inv;
      kvq::scale_of<F>(amax, scale, inv);
      const int64_t si = kSlots ? kv.slot_quant_index(slots[t], kvh) : kv.quant_index_as<false>(0, pos, kvh);
      uint8_t* dst = (is_k ? kv.k8 : kv.v8) + si * head_dim;
      if (4 * lane < head_dim) {
        uint32_t word = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) word |= uint32_t(kvq::encode<F>(v[4 * lane + e], inv)) << (8 * e);
        *reinterpret_cast<uint32_t*>(dst + 4 * lane) = word;
      }
      if (lane == 0) (is_k ? kv.k_scale : kv.v_scale)[si] = scale;
    }
    __syncwarp();  // v is rewritten for the next head
  }
}

// 8 values of K and of V (vector si, byte offset off of a quantized layout) -> bf16 at k_to / v_to.
template <KvQuant F>
__device__ __forceinline__ void dequantize_chunk(const KvLayout& kv, int64_t si, int64_t off, bf16* k_to, bf16* v_to) {
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    const uint2 raw = *reinterpret_cast<const uint2*>((which ? kv.v8 : kv.k8) + off);
    const float scale = (which ? kv.v_scale : kv.k_scale)[si];
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
    uint4 res;
    uint32_t* r = reinterpret_cast<uint32_t*>(&res);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      __nv_bfloat162 p = __floats2bfloat162_rn(kvq::decode<F>(b[2 * e]) * scale, kvq::decode<F>(b[2 * e + 1]) * scale);
      r[e] = *reinterpret_cast<uint32_t*>(&p);
    }
    *reinterpret_cast<uint4*>(which ? v_to : k_to) = res;
  }
}

// One thread per 8 values: (position, kv head, 8-value chunk) of the sequence -> bf16.
template <bool kPaged, KvQuant F>
__global__ void kv_dequantize_kernel(KvLayout kv, int seq, int64_t n_pos, int n_kv_heads, bf16* __restrict__ k_out,
                                     bf16* __restrict__ v_out) {
  const int chunks = kv.head_dim / 8;
  const int64_t total = n_pos * n_kv_heads * chunks;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % chunks);
    const int64_t pv = i / chunks;  // position * n_kv_heads + kv head
    const int kvh = int(pv % n_kv_heads);
    const int64_t pos = pv / n_kv_heads;
    const int64_t si = kv.quant_index_as<kPaged>(seq, pos, kvh), off = si * kv.head_dim + c * 8;
    const int64_t dst = pv * kv.head_dim + c * 8;
    dequantize_chunk<F>(kv, si, off, k_out + dst, v_out + dst);
  }
}

// kv_dequantize_rows: one thread per 8 values of (row, position < max_pos, kv head, chunk); positions
// at or past the row's end are skipped.
template <KvQuant F>
__global__ void kv_dequantize_rows_kernel(KvLayout src, KvLayout dst, const int32_t* __restrict__ ends, int row0,
                                          int64_t n_rows, int64_t max_pos, int n_kv_heads) {
  const int chunks = src.head_dim / 8;
  const int64_t total = n_rows * max_pos * n_kv_heads * chunks;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % chunks);
    const int64_t pv = i / chunks;  // (row, position) * n_kv_heads + kv head
    const int kvh = int(pv % n_kv_heads);
    const int64_t rp = pv / n_kv_heads, pos = rp % max_pos;
    const int row = row0 + int(rp / max_pos);
    if (pos >= ends[row]) continue;
    const int64_t si = src.quant_index_as<true>(row, pos, kvh), off = si * src.head_dim + c * 8;
    const int64_t to = dst.offset_as<true>(row, pos, kvh) + c * 8;
    dequantize_chunk<F>(src, si, off, dst.k + to, dst.v + to);
  }
}

// One warp per (sequence, position, kv head) vector: as rope_qkv_quant's K/V write.
template <KvQuant F>
__global__ void kv_quantize_kernel(const bf16* __restrict__ src, int64_t n_vec, int64_t n_pos, int n_kv_heads,
                                   KvLayout dst, bool values) {
  const int lane = threadIdx.x % 32, head_dim = dst.head_dim;
  for (int64_t vec = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; vec < n_vec;
       vec += int64_t(gridDim.x) * blockDim.x / 32) {
    const int kvh = int(vec % n_kv_heads);
    const int64_t sp = vec / n_kv_heads, pos = sp % n_pos;
    const int seq = int(sp / n_pos);
    const bf16* x = src + vec * head_dim;
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = 4 * lane + e < head_dim ? __bfloat162float(x[4 * lane + e]) : 0.0f;
      amax = fmaxf(amax, fabsf(v[e]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float scale, inv;
    kvq::scale_of<F>(amax, scale, inv);
    const int64_t si = dst.quant_index_as<false>(seq, pos, kvh);
    uint8_t* out = (values ? dst.v8 : dst.k8) + si * head_dim;
    if (4 * lane < head_dim) {
      uint32_t word = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) word |= uint32_t(kvq::encode<F>(v[e], inv)) << (8 * e);
      *reinterpret_cast<uint32_t*>(out + 4 * lane) = word;
    }
    if (lane == 0) (values ? dst.v_scale : dst.k_scale)[si] = scale;
  }
}

}  // namespace

void kv_quantize(const bf16* src, int64_t n_seq, int64_t n_pos, int n_kv_heads, KvLayout dst, bool values,
                 cudaStream_t stream) {
  KILN_CUDA_REQUIRE(dst.quantized() && !dst.paged() && kv_quant_supported(dst.head_dim),
                    "kv_quantize: needs a contiguous quantized layout");
  const int64_t n_vec = n_seq * n_pos * n_kv_heads;
  if (n_vec == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((n_vec + 7) / 8, 65535));
  if (dst.quant == KvQuant::int8)
    kv_quantize_kernel<KvQuant::int8><<<blocks, 256, 0, stream>>>(src, n_vec, n_pos, n_kv_heads, dst, values);
  else
    kv_quantize_kernel<KvQuant::fp8><<<blocks, 256, 0, stream>>>(src, n_vec, n_pos, n_kv_heads, dst, values);
  KILN_CUDA_CHECK_LAUNCH();
}

void rope_qkv_quant(const bf16* qkv, const int32_t* positions, const int32_t* slots, int64_t n,
                    const float* inv_freq, int rot_dim, bool interleaved, int n_heads, int n_kv_heads, int head_dim,
                    bf16* q_out, KvLayout kv, cudaStream_t stream, const float2* cos_sin, int64_t cos_sin_positions) {
  KILN_CUDA_REQUIRE(kv.quantized() && kv_quant_supported(head_dim), "rope_qkv_quant: needs a quantized KV layout, head_dim % 16 == 0");
  KILN_CUDA_REQUIRE(slots || !kv.paged(), "rope_qkv_quant: a paged pool is written by slot");
  if (n == 0) return;
  if (n >= kRopeVecMinTokens && rope_qkv_quant_vec_default() &&
      rope_qkv_quant_vec(qkv, positions, slots, n, inv_freq, rot_dim, interleaved, n_heads, n_kv_heads, head_dim, q_out,
                         kv, stream, cos_sin, cos_sin_positions))
    return;
  kvq::with_write_form(slots != nullptr, kv.quant, [&](auto by_slot, auto format) {
    launch_pdl(rope_qkv_quant_kernel<decltype(by_slot)::value, decltype(format)::value>, dim3(unsigned(n)),
               dim3(kQuantWarps * 32), 0, stream, qkv, positions, slots, inv_freq, cos_sin, cos_sin_positions, rot_dim,
               interleaved, n_heads, n_kv_heads, head_dim, q_out, kv);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void kv_dequantize(KvLayout kv, int64_t seq, int64_t n_pos, int n_kv_heads, bf16* k_out, bf16* v_out,
                   cudaStream_t stream) {
  KILN_CUDA_REQUIRE(kv.quantized() && kv_quant_supported(kv.head_dim), "kv_dequantize: needs a quantized KV layout");
  if (n_pos <= 0) return;
  const int64_t total = n_pos * n_kv_heads * (kv.head_dim / 8);
  const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 65535));
  const bool i8 = kv.quant == KvQuant::int8;
  if (kv.paged()) {
    auto k = i8 ? kv_dequantize_kernel<true, KvQuant::int8> : kv_dequantize_kernel<true, KvQuant::fp8>;
    k<<<blocks, 256, 0, stream>>>(kv, int(seq), n_pos, n_kv_heads, k_out, v_out);
  } else {
    auto k = i8 ? kv_dequantize_kernel<false, KvQuant::int8> : kv_dequantize_kernel<false, KvQuant::fp8>;
    k<<<blocks, 256, 0, stream>>>(kv, int(seq), n_pos, n_kv_heads, k_out, v_out);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void kv_dequantize_rows(const KvLayout& src, const KvLayout& dst, const int32_t* ends, int64_t row0, int64_t n_rows,
                        int64_t max_pos, int n_kv_heads, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(src.quantized() && src.paged() && kv_quant_supported(src.head_dim) && !dst.quantized() &&
                        dst.paged() && dst.k != nullptr && dst.head_dim == src.head_dim,
                    "kv_dequantize_rows: needs a quantized paged source and a bf16 paged destination");
  if (n_rows <= 0 || max_pos <= 0) return;
  const int64_t total = n_rows * max_pos * n_kv_heads * (src.head_dim / 8);
  const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 65535));
  auto k = src.quant == KvQuant::int8 ? kv_dequantize_rows_kernel<KvQuant::int8> : kv_dequantize_rows_kernel<KvQuant::fp8>;
  k<<<blocks, 256, 0, stream>>>(src, dst, ends, int(row0), n_rows, max_pos, n_kv_heads);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
