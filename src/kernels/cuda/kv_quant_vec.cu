// The quantizing K/V write for many tokens, 16 bytes a thread (session 23; the default since session
// 26 measured it: 5.60 -> 2.86 ms an fp8 admission step; KILN_ROPE_QUANT_VEC=0 turns it off,
// rope_qkv_quant_vec forces it).
//
// Why: rope_qkv_quant (kv_quant.cu) gives each token a block and each head a warp that stages its
// values in shared memory and moves them 2 bytes a lane; session 23's admission-step profile put it
// at 5.53 ms a step (31% of the roof) against 2.53 for the bf16 write, rope_qkv_vec_kernel
// (elementwise.cu), which moves 16 bytes a thread. This is that kernel with the quantization added:
// the items of a token are the same (q and k heads in rotated 16-byte items, v in 8-element items),
// and a K or V head's items are consecutive threads of one warp, so the head's amax is a shuffle
// reduction over its group (8 or 16 threads at head_dim 128); each thread then encodes its values
// with the head's scale and stores 8 bytes (K with halves: two 8-byte runs). The group's first
// thread writes the scale. Every lane runs the same shuffles (groups of 2, 4, 8, 16 in turn) and
// takes the level of its own head's group.
// Applies where the groups stay inside warps: full rotation, head_dim % 16 == 0, a token's items a
// multiple of 32, and the V heads' items starting at a multiple of their group (rope_qkv_quant_vec
// returns false otherwise). Numerics: rope_qkv_quant's, per element the same operations (K from the
// fp32 rotation, the same scale_of and encode), so the bytes, scales and q are the same bits.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/kv_quant.cuh"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pointwise_math.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

struct QuantVecShape {
  int k_items, v_items, per_token, k_group, v_group;  // per head: K items, V items; a token's items
};
__host__ __device__ inline QuantVecShape quant_vec_shape(int n_heads, int n_kv_heads, int head_dim,
                                                         bool interleaved) {
  QuantVecShape s;
  s.k_group = rope_vec_rot_items(1, head_dim, interleaved);
  s.v_group = head_dim / 8;
  s.k_items = rope_vec_rot_items(n_heads + n_kv_heads, head_dim, interleaved);
  s.v_items = n_kv_heads * s.v_group;
  s.per_token = s.k_items + s.v_items;
  return s;
}

template <bool kSlots, KvQuant F>
__global__ void __launch_bounds__(kThreads)
    rope_qkv_quant_vec_kernel(const bf16* __restrict__ qkv, const int32_t* __restrict__ positions,
                              const int32_t* __restrict__ slots, const float* __restrict__ inv_freq,
                              const float2* __restrict__ cos_sin, int64_t cos_sin_positions, int64_t n,
                              bool interleaved, int n_heads, int n_kv_heads, int head_dim, bf16* __restrict__ q_out,
                              KvLayout kv) {
  pdl_wait();  // qkv comes from the GEMM before this kernel
  pdl_launch_dependents();
  const QuantVecShape sh = quant_vec_shape(n_heads, n_kv_heads, head_dim, interleaved);
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * sh.per_token) return;  // whole warps: per_token % 32 == 0
  const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim, half = head_dim / 2;
  const int64_t t = idx / sh.per_token;
  const int item = int(idx - t * sh.per_token);
  const bf16* row = qkv + t * (q_dim + 2 * kv_dim);  // [q | k | v]
  const int64_t pos = positions[t];
  auto vector_of = [&](int kvh) {
    return kSlots ? kv.slot_quant_index(slots[t], kvh) : kv.quant_index_as<false>(0, pos, kvh);
  };
  float oa[8], ob[8];
  float amax = 0.0f;
  int group = 1, h = 0, d0 = 0;
  const bool is_v = item >= sh.k_items;
  if (is_v) {  // 8 values of a V head
    const int j = (item - sh.k_items) * 8;
    h = j / head_dim;
    d0 = j - h * head_dim;
    bf16x8_to_float(*reinterpret_cast<const uint4*>(row + q_dim + kv_dim + j), oa);
    group = sh.v_group;
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(oa[e]));
  } else {  // a rotated item of a q or k head, as rope_qkv_vec_kernel
    const int e = item * 8;
    h = interleaved ? e / head_dim : e / half;
    d0 = interleaved ? e - h * head_dim : e - h * half;
    rope_item(row + h * head_dim, d0, half, interleaved, pos, cos_sin, cos_sin_positions, inv_freq, oa, ob);
    if (h >= n_heads) {
      group = sh.k_group;
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(oa[e]));
      if (!interleaved) {
#pragma unroll
        for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(ob[e]));
      }
    }
  }
  amax = kvq::group_max(amax, group);  // every lane: the shuffles are warp-wide
  if (!is_v && h < n_heads) {      // q: bf16 out, as rope_qkv writes it
    bf16* dst = q_out + t * q_dim + h * head_dim;
    *reinterpret_cast<uint4*>(dst + d0) = float_to_bf16x8(oa);
    if (!interleaved) *reinterpret_cast<uint4*>(dst + half + d0) = float_to_bf16x8(ob);
    return;
  }
  const int kvh = is_v ? h : h - n_heads;
  float scale, inv;
  kvq::scale_of<F>(amax, scale, inv);
  const int64_t si = vector_of(kvh);
  uint8_t* dst = (is_v ? kv.v8 : kv.k8) + si * head_dim;
  *reinterpret_cast<uint2*>(dst + d0) = kvq::encode8<F>(oa, inv);
  if (!is_v && !interleaved) *reinterpret_cast<uint2*>(dst + half + d0) = kvq::encode8<F>(ob, inv);
  if (d0 == 0) (is_v ? kv.v_scale : kv.k_scale)[si] = scale;
}

}  // namespace

bool rope_qkv_quant_vec(const bf16* qkv, const int32_t* positions, const int32_t* slots, int64_t n,
                        const float* inv_freq, int rot_dim, bool interleaved, int n_heads, int n_kv_heads,
                        int head_dim, bf16* q_out, KvLayout kv, cudaStream_t stream, const float2* cos_sin,
                        int64_t cos_sin_positions) {
  KILN_CUDA_REQUIRE(kv.quantized() && kv_quant_supported(head_dim), "rope_qkv_quant: needs a quantized KV layout, head_dim % 16 == 0");
  KILN_CUDA_REQUIRE(slots || !kv.paged(), "rope_qkv_quant: a paged pool is written by slot");
  const QuantVecShape sh = quant_vec_shape(n_heads, n_kv_heads, head_dim, interleaved);
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool ok = rot_dim == head_dim && head_dim % 16 == 0 && sh.per_token % 32 == 0 && sh.k_group <= 16 &&
                  sh.v_group <= 16 && sh.k_items % sh.v_group == 0 && aligned(qkv) && aligned(q_out) &&
                  n < (int64_t(1) << 31) / sh.per_token;
  if (!ok) return false;
  if (n == 0) return true;
  const unsigned blocks = unsigned((n * sh.per_token + kThreads - 1) / kThreads);
  kvq::with_write_form(slots != nullptr, kv.quant, [&](auto by_slot, auto format) {
    launch_pdl(rope_qkv_quant_vec_kernel<decltype(by_slot)::value, decltype(format)::value>, dim3(blocks),
               dim3(kThreads), 0, stream, qkv, positions, slots, inv_freq, cos_sin, cos_sin_positions, n, interleaved,
               n_heads, n_kv_heads, head_dim, q_out, kv);
  });
  KILN_CUDA_CHECK_LAUNCH();
  return true;
}

bool rope_qkv_quant_vec_default() {
  static const bool on = env_switch_on("KILN_ROPE_QUANT_VEC");
  return on;
}

}  // namespace kiln::cuda
