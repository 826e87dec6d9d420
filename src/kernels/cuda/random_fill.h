// Fills device bf16 tensors with the hash-based random values of model/random_weights.h, on the
// GPU: an 8B-shape model is generated in place and never exists on the host.
#pragma once

#include "kernels/cuda/common.h"

namespace kiln::cuda {

// dst[i] = bf16(random_value(seed, stream, first + i, scale)) for i < n.
void fill_random_bf16(bf16* dst, int64_t n, uint64_t seed, uint64_t stream_id, uint64_t first, float scale,
                      cudaStream_t stream);

// dst[i] = value (fp32): helper for tests and benchmarks.
void fill_f32(float* dst, int64_t n, float value, cudaStream_t stream);

// dst = src, bytes % 16 == 0: a 16-byte grid-stride copy, the bandwidth ceiling the benchmarks
// report against.
void copy_device(void* dst, const void* src, int64_t bytes, cudaStream_t stream);

// Reads `bytes` (% 16 == 0) of src with the GEMVs' 16-byte streaming load and nothing else (sink is
// written only in a case no real data meets): how fast a kernel that only reads can stream those
// bytes in one call, the ceiling of a read-only kernel such as a GEMV (a copy also writes).
void read_device(const void* src, int64_t bytes, uint32_t* sink, cudaStream_t stream);

}  // namespace kiln::cuda
