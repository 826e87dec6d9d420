// Model shapes by name and random weights for them.
//   preset_config("llama3-8b"): the real models' shapes (speed does not depend on weight values).
//   random_weights(config, seed, scale): host fp32 weights for small configs (tests), values already
//   rounded to bf16 so a bf16 GPU backend and the fp32 CPU backend compute with the same numbers.
// The values come from a counter-based hash (random_value below), so the GPU generator
// (CudaBackend::random, kernels/cuda/random_fill.cu) produces bit-identical weights without an
// 8B-parameter model ever existing on the host.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

#if defined(__CUDACC__)
#define KILN_RNG_HD __host__ __device__ __forceinline__
#else
#define KILN_RNG_HD inline
#endif

namespace kiln {

ModelConfig preset_config(std::string_view name);  // throws invalid_argument for an unknown name
std::vector<std::string> preset_names();

ModelWeights random_weights(const ModelConfig& config, uint64_t seed, float scale);

// Which tensor a random value belongs to: the hash's stream id.
namespace rng_tensor {
constexpr uint64_t embed = 1, final_norm = 2, lm_head = 3;
enum LayerTensor : uint64_t { attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down };
constexpr uint64_t layer(int64_t l, LayerTensor t) { return 16 + uint64_t(l) * 16 + uint64_t(t); }
constexpr bool is_norm(uint64_t stream) {
  return stream == final_norm || (stream >= 16 && ((stream - 16) % 16 == attn_norm || (stream - 16) % 16 == ffn_norm));
}
}  // namespace rng_tensor

KILN_RNG_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of tensor `stream`: uniform in [-1, 1), exact in fp32 (24 random bits).
KILN_RNG_HD float random_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t h = splitmix64(splitmix64(seed ^ (stream * 0xd1b54a32d192ed03ull)) + i);
  return float(int64_t(h >> 40) - (int64_t(1) << 23)) * (1.0f / float(1 << 23));
}

// The fp32 value before bf16 rounding: norms 1 + u/4, everything else scale * u. Written so host
// and device round identically (no fused multiply-add on the device).
KILN_RNG_HD float random_value(uint64_t seed, uint64_t stream, uint64_t i, float scale) {
  float u = random_uniform(seed, stream, i);
#if defined(__CUDA_ARCH__)
  return rng_tensor::is_norm(stream) ? __fadd_rn(1.0f, __fmul_rn(0.25f, u)) : __fmul_rn(scale, u);
#else
  return rng_tensor::is_norm(stream) ? 1.0f + 0.25f * u : scale * u;
#endif
}

}  // namespace kiln
