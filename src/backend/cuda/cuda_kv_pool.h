// CudaBackend's paged KV pool and the buffers of its batching steps (cuda_batch.cpp runs the
// steps).
//
// The pool: one bf16 allocation (or, for --kv-cache int8/fp8, one of bytes and one of
// per-(slot, KV head) fp32 scales, kv_layout.h), per layer K then V, each (num_blocks + 1, block_size,
// n_kv_heads, head_dim); block id num_blocks is scratch (padding entries of a graph batch write
// and read only there). Kernels address it through cuda::KvLayout's paged form (kv_layout.h).
//
// The per-step buffers (activations, packed metadata, the decode workspace, the argmax and the
// sampler's scratch) live with the pool because its captured graphs hold their addresses.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <span>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/device_argmax.h"
#include "backend/cuda/device_sampler.h"
#include "kernels/cuda/kv_layout.h"

namespace kiln::cuda_backend {

// The activation arena's rows for a step of `rows` tokens and `logit_rows` rows with logits: powers
// of two from 16, so steps of nearby sizes share an arena (and its graphs); the logits rows never
// more than the rows. CudaKvPool::ensure_rows allocates this; CudaBackend::step_memory_bytes
// reserves it for the largest step.
struct ArenaRows {
  int64_t rows, logit_rows;
};
inline ArenaRows arena_rows(int64_t rows, int64_t logit_rows) {
  const int64_t r = std::max<int64_t>(16, pow2_at_least(std::max<int64_t>(rows, 1)));
  return {r, std::min(r, std::max<int64_t>(16, pow2_at_least(std::max<int64_t>(logit_rows, 1))))};
}

class CudaKvPool final : public KvPool {
 public:
  // quant != none: the pool holds bytes (kv8) and per-(slot, KV head) scales instead of bf16 (kv).
  CudaKvPool(const void* owner_, const ModelConfig& c, int32_t num_blocks, int32_t block_size, cuda::KvQuant quant_)
      : KvPool(num_blocks, block_size),
        owner(owner_),
        head_dim(int(c.head_dim)),
        n_kv_heads(int(c.n_kv_heads)),
        kv_dim(c.kv_dim()),
        slots((int64_t(num_blocks) + 1) * block_size),
        layer_elems(slots * c.kv_dim()),
        quant(quant_),
        kv(quant_ == cuda::KvQuant::none ? size_t(2 * c.n_layers * layer_elems) : 0),
        kv8(quant_ != cuda::KvQuant::none ? size_t(2 * c.n_layers * layer_elems) : 0),
        scales(quant_ != cuda::KvQuant::none ? size_t(2 * c.n_layers * c.n_kv_heads * slots) : 0) {
    while ((1 << block_shift) < block_size) ++block_shift;
    kv.zero();
    kv8.zero();
    scales.zero();
  }
  ~CudaKvPool() override { drop_graphs(); }
  bool quantized() const { return quant != cuda::KvQuant::none; }

  // Layer l's K/V pool, read through `table` (rows of `stride` block ids).
  cuda::KvLayout layer(int64_t l, const int32_t* table, int64_t stride) const {
    cuda::KvLayout out;
    if (quantized()) {
      out = cuda::KvLayout{nullptr, nullptr, 0, kv_dim, head_dim};
      out.quant = quant;
      out.k8 = kv8.data() + 2 * l * layer_elems;
      out.v8 = out.k8 + layer_elems;
      out.k_scale = scales.data() + 2 * l * n_kv_heads * slots;
      out.v_scale = out.k_scale + n_kv_heads * slots;
      out.scale_head_stride = slots;
    } else {
      bf16* k = kv.data() + 2 * l * layer_elems;
      out = cuda::KvLayout{k, k + layer_elems, 0, kv_dim, head_dim};
    }
    out.block_table = table;
    out.bt_stride = stride;
    out.block_shift = block_shift;
    return out;
  }
  int32_t scratch_block() const { return num_blocks_; }
  int32_t slot(std::span<const int32_t> table, int64_t pos) const {
    return int32_t(int64_t(table[size_t(pos >> block_shift)]) * block_size_ + (pos & (block_size_ - 1)));
  }

  // ---- per-step buffers: grow only; growing drops the graphs that hold the old addresses ----
  // act_quant_cols: room for per-token fp8 activations (Impl::act_quant_cols, 0 without fp8 weights).
  // logit_rows: the step's rows with logits (its wanted rows, at most one an entry).
  void ensure_rows(const ModelConfig& c, int64_t rows, int64_t logit_rows, int64_t act_quant_cols) {
    if (act.rows >= rows && act.logit_rows >= logit_rows) return;
    drop_graphs();
    const ArenaRows r = arena_rows(std::max(rows, act.rows), std::max(logit_rows, act.logit_rows));
    act.allocate(c, r.rows, 0, true, act_quant_cols, r.logit_rows);
  }
  void ensure_meta(int64_t n) {
    host_meta.grow(size_t(n));
    if (int64_t(meta.size()) >= n) return;
    drop_graphs();
    meta = cuda::DeviceBuffer<int32_t>();
    meta = cuda::DeviceBuffer<int32_t>(size_t(std::max<int64_t>(1024, pow2_at_least(n))));
  }
  void ensure_workspace(int64_t floats) {
    if (int64_t(workspace.size()) >= floats) return;
    drop_graphs();
    workspace = cuda::DeviceBuffer<float>();
    workspace = cuda::DeviceBuffer<float>(size_t(pow2_at_least(floats)));
  }
  void drop_graphs() {
    for (auto& [key, g] : graphs)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    graphs.clear();
  }
  int64_t graph_count() const {
    int64_t n = 0;
    for (auto& [key, g] : graphs) n += g.exec != nullptr;
    return n;
  }

  const void* owner;  // the CudaBackend::Impl this pool belongs to
  int head_dim, n_kv_heads;
  int64_t kv_dim, slots, layer_elems;
  int block_shift = 0;
  cuda::KvQuant quant;
  cuda::DeviceBuffer<bf16> kv;  // (n_layers, 2 (K, V), num_blocks + 1, block_size, n_kv_heads, head_dim)
  cuda::DeviceBuffer<uint8_t> kv8;    // quantized: the same shape in bytes
  cuda::DeviceBuffer<float> scales;   // quantized: (n_layers, 2 (K, V), n_kv_heads, slots)

  Activations act;              // (rows) activations of a step, with the gather rows
  cuda::DeviceBuffer<int32_t> meta;                 // packed step metadata (MetaLayout)
  PinnedBuffer<int32_t> host_meta;
  cuda::DeviceBuffer<float> workspace;              // flash-decoding partials
  PinnedBuffer<float> host_logits;
  DeviceArgmax argmax;    // greedy ids of the rows
  DeviceSampler sampler;  // rows with BatchEntry::sampling
  struct Graph {
    bool warmed = false;  // ran eagerly once with this shape
    cudaGraphExec_t exec = nullptr;
  };
  std::map<std::pair<int64_t, int64_t>, Graph> graphs;  // (batch bucket, table width) -> graph
};

}  // namespace kiln::cuda_backend
