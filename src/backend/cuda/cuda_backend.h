// The CUDA backend: the whole Llama-family forward pass on one GPU in bf16.
//
// Weights live on the GPU in bf16, uploaded from host fp32 ModelWeights (rounded to nearest even)
// or generated in place by CudaBackend::random. q/k/v and gate/up are fused into one matrix each.
// Each sequence owns a contiguous bf16 KV cache (layers, capacity, n_kv_heads, head_dim) for K and
// for V; kernels address it only through kernels/cuda/kv_layout.h. The residual stream is fp32.
// forward() runs chunks of up to max_chunk tokens; a single-token step (decode) is captured in a
// CUDA graph per sequence on first use and replayed afterwards (token, position and length go
// through device memory), unless graphs are turned off. Profiling mode times every launch (CUPTI
// kernel records, or CUDA events without CUPTI) and accumulates per kernel name, with analytic
// bytes and FLOPs (graphs are bypassed).
//
// Continuous batching (forward_batch, cuda_batch.cpp): a KvPool is one bf16 allocation holding,
// per layer, K and V as (num_blocks + 1, block_size, n_kv_heads, head_dim); block num_blocks is a
// scratch block that padding entries write to. A step runs all entries' tokens as one matrix of M
// rows; K/V are written by slot, decode entries attend in one paged flash-decoding launch, each
// prefill chunk in its own paged prefill launch. A step of decode entries only (at most 256) is
// padded to a batch-size bucket (1, 2, 4, ..., 256) and a block-table width bucket (a power of
// two), and captured in a CUDA graph per (batch bucket, width bucket) on its second use, then
// replayed with new metadata (one host->device copy a step).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"
#include "profile/chrome_trace.h"

namespace kiln {

struct CudaBackendOptions {
  // Tokens per forward launch sequence; longer inputs are split. 2048 (llama.cpp's -b default): at
  // M = 512 the Llama-3-8B GEMMs leave most of a wave of 128x256 tiles empty (H200: 454-592 TFLOP/s
  // on qkv / gate_up against 676-702 at M = 2048); the price is activation memory (~1.5 GB for
  // Llama-3-8B, most of it the fp32 logits rows).
  int64_t max_chunk = 2048;
  bool use_graphs = true;
  // Batch-1 decode with RoPE (+ the K/V write) and SwiGLU folded into the qkv and gate/up GEMVs
  // (gemv_fused.h) where the weights and shape allow; same bits either way (with norm_fold off).
  // KILN_FUSED_DECODE=0 also turns it off.
  bool fused_decode = true;
  // With fused_decode: the RMSNorms between the decode GEMVs folded into them (gemv_fused.h:
  // NormProduce / NormApply; not the same bits as the norm kernel) in steps over bf16 caches of
  // more than 256 positions, and in every step over a bf16 cache where o and down are int8 / int4
  // (session 46; cuda_backend::NormFoldRule). KILN_NORM_FOLD=0 also turns it off.
  bool norm_fold = true;
  // A single-sequence batch-1 decode step (bf16 cache) as one persistent kernel, the decode
  // megakernel (kernels/cuda/megakernel/decode_megakernel.h), where the model and the device take
  // it, instead of the fused kernels above. Off by default: on the H200 it measured 4-12% slower
  // than those kernels in every format (docs/performance/megakernel.md). KILN_MEGAKERNEL=1 turns it
  // on for any backend, KILN_MEGAKERNEL=0 off.
  bool megakernel = false;
};

// One kernel name's totals over the launches timed since the last reset.
struct KernelStat {
  std::string name;
  int64_t calls = 0;
  double total_ms = 0;
  double idle_ms = 0;  // of total_ms, the GPU idle before the kernels (launch gaps; CUPTI timer only)
  double bytes = 0;  // analytic minimum bytes moved, summed over calls
  double flops = 0;  // analytic FLOPs, summed over calls
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(ModelConfig config, const ModelWeights& weights, CudaBackendOptions options = {});
  // Weights drawn on the GPU from the hash of model/random_weights.h: bit-identical to
  // random_weights(config, seed, scale) on the host, for any size. quant != none: the layers'
  // projections (q/k/v, o, gate/up, down) are random packed weights of that format instead (int8 per
  // channel, int4 groups of 128, fp8 per channel; values of about +-scale), for speed runs; the
  // embedding stays bf16, and the head (untied) takes head_quant (as `kiln quantize --head` writes
  // it; llama.cpp's Q8_0 files have an 8-bit head).
  static std::unique_ptr<CudaBackend> random(const ModelConfig& config, uint64_t seed, float scale,
                                             CudaBackendOptions options = {}, QuantFormat quant = QuantFormat::none,
                                             QuantFormat head_quant = QuantFormat::none);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  // kernels/cuda/sampling.h; KILN_DEVICE_SAMPLING=0 sends sampled rows' logits to the host sampler.
  bool samples_on_device() const override;
  const ModelConfig& config() const override;
  std::unique_ptr<KvSequence> new_sequence(int64_t capacity) override;
  // bf16 K/V: 2 bytes a value; a quantized cache (--kv-cache int8|fp8): 1 byte a value and one fp32
  // scale per (token, KV head), so a pool holds about twice the tokens.
  int64_t kv_bytes_per_element() const override;
  int64_t kv_bytes_per_token() const override;
  // block_size: a power of two (16 is the usual); the pool may be used only with this backend.
  std::unique_ptr<KvPool> new_kv_pool(int32_t num_blocks, int32_t block_size) override;

  // gpu_memory_fraction (0..1] of the device memory free now: the engine's default pool size.
  int64_t default_kv_cache_bytes(double gpu_memory_fraction) const override;
  // The activation arena of the largest step (CudaKvPool::ensure_rows at that size).
  int64_t step_memory_bytes(int64_t max_tokens, int64_t max_seqs) const override;
  int64_t device_memory_bytes() const override;

  // Bytes of device memory free now (cudaMemGetInfo), to size a pool from a memory fraction.
  static int64_t free_device_memory();
  static int64_t total_device_memory();
  // CUDA graphs captured so far for forward_batch steps on `pool` (tests, diagnostics).
  int64_t batch_graph_count(const KvPool& pool) const;

  void set_use_graphs(bool on);
  bool use_graphs() const;
  // Profiling times every launch (CUPTI kernel records where libcupti loads, else CUDA events) and
  // accumulates kernel_stats(); graphs are bypassed while it is on.
  void set_profiling(bool on);
  std::string profiling_timer() const;  // which timer the last set_profiling(true) chose, and why
  bool profiling_has_kernel_records() const;  // that timer is CUPTI's (last_step_trace has data)
  std::vector<KernelStat> kernel_stats() const;  // sorted by total time, largest first
  // Whether single-sequence decode steps run the decode megakernel, and if not, why.
  bool uses_megakernel() const;
  std::string megakernel_note() const;
  // With KILN_MEGAKERNEL_TRACE=1, the last megakernel step's phases as a table (else empty).
  std::string megakernel_trace_report() const;
  // The kernels of the last profiled step as the GPU ran them (CUPTI's timer only; empty with
  // events): kiln profile --trace.
  std::vector<profile::TraceEvent> last_step_trace() const;
  void reset_kernel_stats();
  int64_t weight_bytes() const;

  struct Impl;

 private:
  void forward_impl(KvSequence& seq, std::span<const int32_t> tokens, bool all_logits,
                    std::vector<float>& logits) override;
  // A one-token step through the decode graph returns the pinned buffer the graph copies its logits
  // into, not a copy of it; anything else takes Backend's default.
  std::span<float> forward_last_impl(KvSequence& seq, std::span<const int32_t> tokens) override;
  void forward_batch_impl(KvPool& pool, std::span<const BatchEntry> entries, std::vector<float>& logits,
                          std::vector<int32_t>* argmax) override;
  CudaBackend(ModelConfig config, CudaBackendOptions options, int);
  // native (bf16), int8 and fp8 (head dims that are multiples of 16, kv_quant.h).
  bool supports_kv_cache_format(KvCacheFormat f) const override;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
