// Host side of the persistent decode kernels (attention_decode_stream.cu, attention_decode_slices.cu):
// their blocks per SM for each query group (their shared memory grows with it), measured once per
// instantiation, and the dispatch of (head dim, layout) to the instantiation that serves it.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_attributes.h"

namespace kiln::cuda {

constexpr int kDecodeMaxGroup = 8;  // query heads per KV head the persistent kernels serve

// The head shapes both persistent kernels serve: groups of 1..8 query heads per KV head (their q
// slots), head dims of whole 16-byte chunks up to the tile width.
inline bool persistent_decode_applies(int n_heads, int n_kv_heads, int head_dim) {
  const int group = n_kv_heads > 0 ? n_heads / n_kv_heads : 0;
  return group >= 1 && group <= kDecodeMaxGroup && head_dim % 8 == 0 && head_dim <= kAttnMaxHeadDim;
}

struct GroupOccupancy {
  int sms = 0;
  int per_sm[kDecodeMaxGroup + 1] = {};  // blocks a SM at group 1..8
};

// Raises the kernel's dynamic shared-memory limit to its largest group's and measures its blocks per
// SM at every group; smem_of(group): the launch's dynamic shared memory.
template <class Kernel, class SmemOf>
GroupOccupancy measure_group_occupancy(Kernel kernel, int threads, SmemOf smem_of) {
  GroupOccupancy r;
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(smem_of(kDecodeMaxGroup))));
  r.sms = device_sm_count();
  for (int g = 1; g <= kDecodeMaxGroup; ++g)
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.per_sm[g], kernel, threads, smem_of(g)));
  return r;
}

// Calls f(D tag, paged tag) for the instantiation serving these arguments (D = 64 or 128).
template <class F>
decltype(auto) with_decode_instance(int head_dim, bool paged, F&& f) {
  using D64 = std::integral_constant<int, 64>;
  using D128 = std::integral_constant<int, 128>;
  if (head_dim <= 64) return paged ? f(D64{}, std::true_type{}) : f(D64{}, std::false_type{});
  return paged ? f(D128{}, std::true_type{}) : f(D128{}, std::false_type{});
}

}  // namespace kiln::cuda
