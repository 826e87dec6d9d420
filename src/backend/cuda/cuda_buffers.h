// The CUDA backend's device-side buffers (cuda_backend_impl.h's Impl holds them): page-locked host
// staging, one layer's weights on the device, and the activation arena a forward step works in.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_weight.h"
#include "kernels/cuda/matmul.h"
#include "model/config.h"

namespace kiln::cuda_backend {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::OutMode;

// Buffers that grow per step grow to powers of two (fewer reallocations, fewer graph drops).
inline int64_t pow2_at_least(int64_t n) {
  int64_t b = 1;
  while (b < n) b <<= 1;
  return b;
}

// Page-locked host memory (RAII, growable: grow() keeps nothing).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void grow(size_t n) {  // ensures room for n elements
    if (n <= n_) return;
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    n_ = 0;
    KILN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    n_ = n;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

struct DeviceLayer {
  DeviceBuffer<bf16> attn_norm;  // (hidden)
  cuda::DeviceWeight w_qkv;      // (q_dim + 2 kv_dim, hidden): wq, wk, wv stacked (bf16 or quantized)
  DeviceBuffer<bf16> b_qkv;      // (q_dim + 2 kv_dim) or empty
  cuda::DeviceWeight wo;         // (hidden, q_dim)
  DeviceBuffer<bf16> ffn_norm;   // (hidden)
  cuda::DeviceWeight w_gu;       // (2 inter, hidden): w_gate, w_up stacked
  cuda::DeviceWeight w_down;     // (hidden, inter)
};

// Activations for up to `rows` tokens, carved from one allocation (256-byte aligned slices, so
// 16-byte vector loads stay legal). Captured graphs hold these addresses: reallocating means
// dropping the graphs that use them.
struct Activations {
  DeviceBuffer<char> arena;
  int64_t rows = 0;
  float* x = nullptr;       // (rows, hidden) fp32 residual stream
  bf16* xn = nullptr;       // (rows, hidden) normed input of the next projection
  bf16* qkv = nullptr;      // (rows, q_dim + 2 kv_dim)
  bf16* q = nullptr;        // (rows, q_dim) rotated queries
  bf16* attn = nullptr;     // (rows, q_dim) attention output
  bf16* gu = nullptr;       // (rows, 2 inter) [gate | up]
  bf16* h = nullptr;        // (rows, inter)
  float* logits = nullptr;  // (rows, vocab)
  float* xg = nullptr;      // (rows, hidden) gathered residual rows (only when gather)
  float* norm_sumsq = nullptr;  // hidden / 16: the folded RMSNorm's tile partials (cuda::NormProduce; batch 1 only)
  int32_t* ints = nullptr;  // n_ints int32 (token/position staging of the single-sequence path)
  // Split-K partials of the matrix products with kGemvMaxRows < M <= kSplitKMaxRows (matmul.h);
  // only when rows > kGemvMaxRows. In the arena: a fixed address for the captured graphs.
  cuda::MatmulWorkspace splitk;
  // fp8 (W8A8) weights: the per-token quantized activations of one product, (rows, act_quant_cols)
  // e4m3 bytes and one scale per row; only when the model has fp8 weights (act_quant_cols > 0).
  uint8_t* xq = nullptr;
  float* xs = nullptr;
  int64_t xq_cols = 0;

  void allocate(const ModelConfig& c, int64_t n_rows, int64_t n_ints, bool gather, int64_t act_quant_cols = 0) {
    const size_t C = size_t(n_rows), H = size_t(c.hidden_size), I = size_t(c.intermediate_size);
    const size_t qkv_dim = size_t(c.q_dim() + 2 * c.kv_dim()), q_dim = size_t(c.q_dim());
    size_t offset = 0;
    auto carve = [&](size_t bytes) {
      size_t at = offset;
      offset += (bytes + 255) / 256 * 256;
      return at;
    };
    size_t o_x = carve(C * H * 4), o_xn = carve(C * H * 2), o_qkv = carve(C * qkv_dim * 2), o_q = carve(C * q_dim * 2),
           o_attn = carve(C * q_dim * 2), o_gu = carve(C * 2 * I * 2), o_h = carve(C * I * 2),
           o_logits = carve(C * size_t(c.vocab_size) * 4), o_ints = carve(size_t(n_ints) * 4),
           o_xg = carve(gather ? C * H * 4 : 0), o_sumsq = carve(H / 16 * 4);
    const int64_t splitk_floats = n_rows > cuda::kGemvMaxRows ? cuda::kSplitKWorkspaceFloats : 0;
    const size_t o_splitk = carve(size_t(splitk_floats) * 4);
    const size_t o_xq = carve(C * size_t(act_quant_cols)), o_xs = carve(act_quant_cols ? C * 4 : 0);
    arena = DeviceBuffer<char>();  // free first: the old arena may be large
    arena = DeviceBuffer<char>(offset);
    rows = n_rows;
    char* base = arena.data();
    x = reinterpret_cast<float*>(base + o_x);
    xn = reinterpret_cast<bf16*>(base + o_xn);
    qkv = reinterpret_cast<bf16*>(base + o_qkv);
    q = reinterpret_cast<bf16*>(base + o_q);
    attn = reinterpret_cast<bf16*>(base + o_attn);
    gu = reinterpret_cast<bf16*>(base + o_gu);
    h = reinterpret_cast<bf16*>(base + o_h);
    logits = reinterpret_cast<float*>(base + o_logits);
    ints = reinterpret_cast<int32_t*>(base + o_ints);
    xg = gather ? reinterpret_cast<float*>(base + o_xg) : nullptr;
    norm_sumsq = reinterpret_cast<float*>(base + o_sumsq);
    splitk = {splitk_floats ? reinterpret_cast<float*>(base + o_splitk) : nullptr, splitk_floats};
    xq = act_quant_cols ? reinterpret_cast<uint8_t*>(base + o_xq) : nullptr;
    xs = act_quant_cols ? reinterpret_cast<float*>(base + o_xs) : nullptr;
    xq_cols = act_quant_cols;
  }
};

}  // namespace kiln::cuda_backend
