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
  int64_t logit_rows = 0;   // rows of logits and xg
  float* x = nullptr;       // (rows, hidden) fp32 residual stream
  bf16* xn = nullptr;       // (rows, hidden) normed input of the next projection
  bf16* qkv = nullptr;      // (rows, q_dim + 2 kv_dim)
  bf16* q = nullptr;        // (rows, q_dim) rotated queries
  bf16* attn = nullptr;     // (rows, q_dim) attention output
  bf16* gu = nullptr;       // (rows, 2 inter) [gate | up]
  bf16* h = nullptr;        // (rows, inter)
  float* logits = nullptr;  // (logit_rows, vocab)
  float* xg = nullptr;      // (logit_rows, hidden) gathered residual rows (only when gather)
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

  // The arena's slices for n_rows tokens of which up to n_logit_rows have logits (and, with gather,
  // a gathered residual row): the head's rows are the step's wanted rows, at most one an entry, so
  // a 16384-token step of 2048 sequences carves 2048 rows of logits (1 GB at Llama 3's vocabulary),
  // not 16384 (8.4 GB). `total` is what allocate takes: the engine reserves it before sizing the
  // KV pool (Backend::step_memory_bytes).
  struct Layout {
    size_t x, xn, qkv, q, attn, gu, h, logits, ints, xg, sumsq, splitk, xq, xs, total;
    int64_t splitk_floats;
  };
  static Layout layout(const ModelConfig& c, int64_t n_rows, int64_t n_logit_rows, int64_t n_ints, bool gather,
                       int64_t act_quant_cols) {
    const size_t C = size_t(n_rows), L = size_t(n_logit_rows), H = size_t(c.hidden_size),
                 I = size_t(c.intermediate_size);
    const size_t qkv_dim = size_t(c.q_dim() + 2 * c.kv_dim()), q_dim = size_t(c.q_dim());
    size_t offset = 0;
    auto carve = [&](size_t bytes) {
      size_t at = offset;
      offset += (bytes + 255) / 256 * 256;
      return at;
    };
    Layout o;
    o.x = carve(C * H * 4), o.xn = carve(C * H * 2), o.qkv = carve(C * qkv_dim * 2), o.q = carve(C * q_dim * 2);
    o.attn = carve(C * q_dim * 2), o.gu = carve(C * 2 * I * 2), o.h = carve(C * I * 2);
    o.logits = carve(L * size_t(c.vocab_size) * 4), o.ints = carve(size_t(n_ints) * 4);
    o.xg = carve(gather ? L * H * 4 : 0), o.sumsq = carve(H / 16 * 4);
    o.splitk_floats = n_rows > cuda::kGemvMaxRows ? cuda::kSplitKWorkspaceFloats : 0;
    o.splitk = carve(size_t(o.splitk_floats) * 4);
    o.xq = carve(C * size_t(act_quant_cols)), o.xs = carve(act_quant_cols ? C * 4 : 0);
    o.total = offset;
    return o;
  }

  // n_logit_rows < 0: every row may have logits.
  void allocate(const ModelConfig& c, int64_t n_rows, int64_t n_ints, bool gather, int64_t act_quant_cols = 0,
                int64_t n_logit_rows = -1) {
    if (n_logit_rows < 0) n_logit_rows = n_rows;
    const Layout lo = layout(c, n_rows, n_logit_rows, n_ints, gather, act_quant_cols);
    arena = DeviceBuffer<char>();  // free first: the old arena may be large
    arena = DeviceBuffer<char>(lo.total);
    rows = n_rows;
    logit_rows = n_logit_rows;
    char* base = arena.data();
    x = reinterpret_cast<float*>(base + lo.x);
    xn = reinterpret_cast<bf16*>(base + lo.xn);
    qkv = reinterpret_cast<bf16*>(base + lo.qkv);
    q = reinterpret_cast<bf16*>(base + lo.q);
    attn = reinterpret_cast<bf16*>(base + lo.attn);
    gu = reinterpret_cast<bf16*>(base + lo.gu);
    h = reinterpret_cast<bf16*>(base + lo.h);
    logits = reinterpret_cast<float*>(base + lo.logits);
    ints = reinterpret_cast<int32_t*>(base + lo.ints);
    xg = gather ? reinterpret_cast<float*>(base + lo.xg) : nullptr;
    norm_sumsq = reinterpret_cast<float*>(base + lo.sumsq);
    splitk = {lo.splitk_floats ? reinterpret_cast<float*>(base + lo.splitk) : nullptr, lo.splitk_floats};
    xq = act_quant_cols ? reinterpret_cast<uint8_t*>(base + lo.xq) : nullptr;
    xs = act_quant_cols ? reinterpret_cast<float*>(base + lo.xs) : nullptr;
    xq_cols = act_quant_cols;
  }
};

}  // namespace kiln::cuda_backend
