#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/env.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_decode_trace.h"
#include "kernels/cuda/attention_o_trace.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/quant/qgemv_trace.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/tile_counters.h"
#include "model/random_weights.h"
#include "profile/cost_model.h"

namespace kiln {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::OutMode;
using cuda_backend::DeviceLayer;

namespace {

// ---- weights ---------------------------------------------------------------------------------

// Host fp32 matrices -> one bf16 device buffer, stacked in order.
DeviceBuffer<bf16> upload_bf16(std::initializer_list<const HostMatrix*> parts) {
  size_t total = 0;
  for (const HostMatrix* m : parts) total += m->data.size();
  std::vector<uint16_t> host;
  host.reserve(total);
  for (const HostMatrix* m : parts)
    for (float f : m->data) host.push_back(f32_to_bf16(f));
  DeviceBuffer<bf16> buf(total);
  if (total) buf.upload(std::span<const bf16>(reinterpret_cast<const bf16*>(host.data()), total));
  return buf;
}

// ---- the per-sequence state ------------------------------------------------------------------

class CudaKvSequence final : public KvSequence {
 public:
  // quant != none: K/V as bytes with per-(position, KV head) scales (kv_layout.h), k and v empty.
  CudaKvSequence(const ModelConfig& c, int64_t capacity, cuda::KvQuant quant_)
      : KvSequence(capacity),
        quant(quant_),
        k(quant_ == cuda::KvQuant::none ? size_t(c.n_layers * capacity * c.kv_dim()) : 0),
        v(k.size()),
        k8(quant_ != cuda::KvQuant::none ? size_t(c.n_layers * capacity * c.kv_dim()) : 0),
        v8(k8.size()),
        k_scale(quant_ != cuda::KvQuant::none ? size_t(c.n_layers * c.n_kv_heads * capacity) : 0),
        v_scale(k_scale.size()),
        workspace(size_t(cuda::decode_workspace_floats(1, int(c.n_heads), int(c.head_dim), capacity))) {}
  ~CudaKvSequence() override {
    if (graph) cudaGraphExecDestroy(graph);
  }
  void advance(int64_t n) { n_past_ += n; }
  cuda::KvLayout layer(const ModelConfig& c, int64_t l) const {
    const int64_t per_layer = capacity_ * c.kv_dim();
    if (quant == cuda::KvQuant::none)
      return cuda::KvLayout{k.data() + l * per_layer, v.data() + l * per_layer, per_layer * c.n_layers, c.kv_dim(),
                            int(c.head_dim)};
    cuda::KvLayout out{nullptr, nullptr, per_layer * c.n_layers, c.kv_dim(), int(c.head_dim)};
    const int64_t scales_per_layer = c.n_kv_heads * capacity_;  // (n_kv_heads, capacity) per layer
    out.quant = quant;
    out.k8 = k8.data() + l * per_layer;
    out.v8 = v8.data() + l * per_layer;
    out.k_scale = k_scale.data() + l * scales_per_layer;
    out.v_scale = v_scale.data() + l * scales_per_layer;
    out.scale_seq_stride = scales_per_layer * c.n_layers;
    out.scale_head_stride = capacity_;
    return out;
  }

  cuda::KvQuant quant;
  DeviceBuffer<bf16> k, v;          // (n_layers, capacity, n_kv_heads, head_dim) each
  DeviceBuffer<uint8_t> k8, v8;     // quantized: the same shape in bytes
  DeviceBuffer<float> k_scale, v_scale;  // quantized: (n_layers, n_kv_heads, capacity)
  DeviceBuffer<float> workspace;    // flash-decoding partials, sized for the capacity
  cudaGraphExec_t graph = nullptr;  // the captured decode step of this sequence
};

// ---- the single-sequence forward -------------------------------------------------------------

using Impl = CudaBackend::Impl;

// Enqueues the forward of n tokens at positions start.. (tokens, positions and kv_len already in
// m.act.ints on the device) and the logits of rows out_first .. n-1 into m.act.logits.
void enqueue(Impl& m, CudaKvSequence& seq, int64_t n, int64_t start, int64_t out_first) {
  const ModelConfig& c = m.c;
  const cuda_backend::Activations& a = m.act;
  const int64_t C = m.opt.max_chunk;
  const int32_t* tokens = a.ints;
  const int32_t* positions = a.ints + C;
  const int32_t* kv_len = a.ints + 2 * C;
  // A decode step (one token) runs the fused GEMVs where they apply (Impl::fused_decode_ok), the qkv
  // one into a quantized cache too unless switched off (Impl::fused_decode_for).
  const bool quantized = seq.quant != cuda::KvQuant::none;
  if (n == 1 && m.use_megakernel && !quantized) {  // the decode megakernel (opt-in, cuda_megakernel.cpp)
    m.op("embed", profile::embed(1, c.hidden_size),
         [&] { cuda::embed_gather(m.embed.data(), tokens, a.x, 1, c.hidden_size, m.s()); });
    m.enqueue_megakernel(a, positions, seq.k.data(), seq.v.data(), seq.capacity() * c.kv_dim(), start);
    if (out_first < n) m.enqueue_head(a, a.x, 1);
    return;
  }
  // Where the fused qkv GEMV (decode) or the qkv GEMM's epilogue (prefill, Impl::enqueue_qkv_rope)
  // writes K/V when they rotate them themselves.
  const Impl::RopedRows roped_rows{positions, nullptr, [&](int64_t l) { return seq.layer(c, l); }};
  const Impl::FusedDecode fused_decode = m.fused_decode_for(roped_rows, quantized, seq.capacity());
  const bool fused = n == 1 && m.fused_decode_ok();
  m.enqueue_layers(
      a, tokens, n,
      [&](int64_t l, bool roped) -> bool {
        const cuda::KvLayout kv = seq.layer(c, l);
        if (!roped && (!fused || !fused_decode.qkv)) {  // unless the qkv GEMV / GEMM rotated and wrote K/V
          m.op("rope_qkv", profile::rope_qkv(n, c, m.kv_widths(kv.quantized())), [&] {
            cuda::rope_qkv(a.qkv, positions, nullptr, n, m.inv_freq.data(), c.rope.rot_dim,
                           c.rope.style == RopeStyle::interleaved, int(c.n_heads), int(c.n_kv_heads), int(c.head_dim),
                           a.q, kv, m.s(), m.rope_table.data(), m.rope_positions);
          });
        }
        if (n == 1 && (Impl::decode_probe() & Impl::kProbeSkipAttention)) {
          // KILN_DECODE_PROBE: no attention (timing bound only)
        } else if (n == 1 && fused && !fused_decode.fold_norms && m.attn_o_for(l, kv, seq.capacity())) {
          const cuda::QWeight wo = m.layers[size_t(l)].wo.view();
          profile::Cost cost = profile::attention(1, start, c, m.kv_widths(false));
          cost += profile::linear(1, wo.rows, wo.cols, 8, m.weight_widths(wo));
          m.op("attention+o.fused", cost, [&] {
            cuda::attention_o_fused(a.q, kv, kv_len, wo, a.x, {m.attn_o_partials.data(), m.attn_o_counters.data()},
                                    int(c.n_heads), int(c.n_kv_heads), int(c.head_dim), m.s());
          });
          return true;
        } else if (n == 1) {
          // start is for the analytic count only; the kernel reads the length from kv_len (graph replay)
          const cuda::DecodeWorkspace ws =
              cuda::decode_workspace(seq.workspace.data(), 1, int(c.n_heads), int(c.head_dim), seq.capacity());
          m.op("attention.decode", profile::attention(1, start, c, m.kv_widths(quantized)), [&] {
            cuda::attention_decode(a.q, kv, kv_len, seq.capacity(), a.attn, ws, 1, int(c.n_heads),
                                   int(c.n_kv_heads), int(c.head_dim), m.s());
          });
        } else {
          const cuda::KvLayout read = quantized ? m.dequantized(kv, 0, start + n) : kv;
          m.op("attention.prefill", profile::attention(n, start, c), [&] {
            cuda::attention_prefill(a.q, read, a.attn, n, start, int(c.n_heads), int(c.n_kv_heads), int(c.head_dim),
                                    m.s());
          });
        }
        return false;
      },
      fused ? &fused_decode : nullptr, &roped_rows);
  if (out_first < n) m.enqueue_head(a, a.x + out_first * c.hidden_size, n - out_first);
}

void stage_ints(Impl& m, std::span<const int32_t> tokens, int64_t start) {
  const int64_t C = m.opt.max_chunk, n = int64_t(tokens.size());
  int32_t* h = m.host_ints.data();
  for (int64_t i = 0; i < n; ++i) {
    h[i] = tokens[size_t(i)];
    h[C + i] = int32_t(start + i);
  }
  h[2 * C] = int32_t(start + n);
}
void copy_ints_to_device(Impl& m) {
  KILN_CUDA_CHECK(cudaMemcpyAsync(m.act.ints, m.host_ints.data(), size_t(2 * m.opt.max_chunk + 1) * 4,
                                  cudaMemcpyHostToDevice, m.s()));
}

// One decode step through the sequence's graph (captured on first use); its logits land in
// m.host_logits. The caller advances the sequence.
void decode_graph(Impl& m, CudaKvSequence& seq, int32_t token) {
  const int64_t vocab = m.c.vocab_size;
  stage_ints(m, std::span<const int32_t>(&token, 1), seq.n_past());
  if (!seq.graph) {
    cudaGraph_t graph = nullptr;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(m.s(), cudaStreamCaptureModeThreadLocal));
    try {
      copy_ints_to_device(m);
      enqueue(m, seq, 1, seq.n_past(), 0);
      if (!(Impl::decode_probe() & Impl::kProbeSkipReadback))
        KILN_CUDA_CHECK(cudaMemcpyAsync(m.host_logits.data(), m.act.logits, size_t(vocab) * 4,
                                        cudaMemcpyDeviceToHost, m.s()));
    } catch (...) {
      cudaStreamEndCapture(m.s(), &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    KILN_CUDA_CHECK(cudaStreamEndCapture(m.s(), &graph));
    cudaError_t err = cudaGraphInstantiate(&seq.graph, graph, 0);
    cudaGraphDestroy(graph);
    KILN_CUDA_CHECK(err);
  }
  KILN_CUDA_CHECK(cudaGraphLaunch(seq.graph, m.s()));
  KILN_CUDA_CHECK(cudaStreamSynchronize(m.s()));
}

// Whether a one-token step takes the decode graph: not while profiling (the profile times each
// kernel of an eagerly launched step).
bool takes_decode_graph(const Impl& m, int64_t n) { return n == 1 && m.opt.use_graphs && !m.profiling; }

// A chunk of at most max_chunk tokens; appends the logits of its last token, or of all its tokens,
// to *out; with out == nullptr (an inner chunk of a prompt whose logits nobody wants) it skips the
// final norm and lm_head (0.28 ms per chunk for Llama 3's 128k vocabulary).
void run_chunk(Impl& m, CudaKvSequence& seq, std::span<const int32_t> tokens, bool all_logits,
               std::vector<float>* out) {
  const int64_t n = int64_t(tokens.size()), start = seq.n_past(), vocab = m.c.vocab_size;
  if (out && takes_decode_graph(m, n)) {
    decode_graph(m, seq, tokens[0]);
    out->insert(out->end(), m.host_logits.data(), m.host_logits.data() + vocab);
  } else {
    stage_ints(m, tokens, start);
    copy_ints_to_device(m);
    const int64_t out_first = !out ? n : all_logits ? 0 : n - 1, n_out = n - out_first;
    enqueue(m, seq, n, start, out_first);
    if (out) {
      size_t at = out->size();
      out->resize(at + size_t(n_out * vocab));
      KILN_CUDA_CHECK(cudaMemcpyAsync(out->data() + at, m.act.logits, size_t(n_out * vocab) * 4,
                                      cudaMemcpyDeviceToHost, m.s()));
    }
    // Also before the next chunk restages host_ints, which the copy above still reads.
    KILN_CUDA_CHECK(cudaStreamSynchronize(m.s()));
    if (m.profiling) m.collect_timings();
  }
  seq.advance(n);
}

}  // namespace

// ---- the backend's state ---------------------------------------------------------------------

bf16* CudaBackend::Impl::kv_scratch_for(int64_t positions) {
  const int64_t kv_dim = c.kv_dim();
  if (int64_t(kv_scratch.size()) < 2 * positions * kv_dim) {
    int64_t grown = 2048;
    while (grown < positions) grown *= 2;
    KILN_CUDA_CHECK(cudaStreamSynchronize(s()));
    kv_scratch = DeviceBuffer<bf16>();
    kv_scratch = DeviceBuffer<bf16>(size_t(2 * grown * kv_dim));
  }
  return kv_scratch.data();
}

cuda::KvLayout CudaBackend::Impl::dequantized(const cuda::KvLayout& kv, int64_t seq, int64_t end) {
  const int64_t kv_dim = c.kv_dim();
  bf16* k = kv_scratch_for(end);
  bf16* v = k + end * kv_dim;
  op("kv_dequantize", kv_dequantize_cost(end), [&] { cuda::kv_dequantize(kv, seq, end, int(c.n_kv_heads), k, v, s()); });
  return cuda::KvLayout{k, v, end * kv_dim, kv_dim, int(c.head_dim)};
}

void CudaBackend::Impl::init_common() {
  c.validate();
  KILN_CHECK(c.head_dim % 8 == 0 && c.head_dim <= cuda::kAttnMaxHeadDim, unsupported,
             "the CUDA backend supports head dims that are multiples of 8 up to {}, not {}", cuda::kAttnMaxHeadDim,
             c.head_dim);
  KILN_CHECK(opt.max_chunk >= 1, invalid_argument, "max_chunk must be positive");
  std::vector<float> f(size_t(c.rope.rot_dim / 2));
  for (int i = 0; i < c.rope.rot_dim / 2; ++i) f[size_t(i)] = cpu::rope_inv_freq(c.rope, i);
  inv_freq = DeviceBuffer<float>(f);
  rope_positions = std::clamp<int64_t>(c.context_length, 1, int64_t(1) << 18);  // <= 128 MB at rot_dim 128
  rope_table = DeviceBuffer<float2>(size_t(rope_positions * (c.rope.rot_dim / 2)));
  cuda::rope_table_fill(rope_table.data(), rope_positions, inv_freq.data(), c.rope.rot_dim, s());
  kv_q8_values = DeviceBuffer<float>(size_t(2 * c.kv_dim()));
  kv_q8_sync = DeviceBuffer<uint32_t>(size_t(4 * c.n_kv_heads));
  KILN_CUDA_CHECK(cudaMemsetAsync(kv_q8_sync.data(), 0, kv_q8_sync.size() * sizeof(uint32_t), s()));
  const int64_t C = opt.max_chunk;
  act.allocate(c, C, 2 * C + 1, false);
  host_ints.grow(size_t(2 * C + 1));
  host_logits.grow(size_t(c.vocab_size));
  // The diagnostics' record areas (KILN_ATTN_STREAM_TRACE, KILN_QGEMV_TRACE, KILN_ATTN_O_TRACE), before any
  // graph capture.
  cuda::decode_stream_trace_prepare();
  cuda::qgemv_trace_prepare();
  cuda::attention_o_trace_prepare();
  // The decode GEMVs' per-launch tile counters (tile_counters.h), before any graph capture too.
  cuda::tile_counters_prepare();
}

// ---- construction ----------------------------------------------------------------------------

CudaBackend::CudaBackend(ModelConfig config, CudaBackendOptions options, int)
    : impl_(std::make_unique<Impl>(std::move(config), options)) {
  impl_->init_common();
}

CudaBackend::CudaBackend(ModelConfig config, const ModelWeights& w, CudaBackendOptions options)
    : CudaBackend(std::move(config), options, 0) {
  Impl& m = *impl_;
  KILN_CHECK(int64_t(w.layers.size()) == m.c.n_layers, invalid_model, "weights have {} layers, the config {}",
             w.layers.size(), m.c.n_layers);
  m.embed = upload_bf16({&w.embed});
  m.final_norm = upload_bf16({&w.final_norm});
  if (!w.lm_head.empty()) m.lm_head = cuda::upload_weight({&w.lm_head});
  for (const LayerWeights& L : w.layers) {
    DeviceLayer d;
    d.attn_norm = upload_bf16({&L.attn_norm});
    d.w_qkv = cuda::upload_weight({&L.wq, &L.wk, &L.wv});
    if (!L.bq.empty()) d.b_qkv = upload_bf16({&L.bq, &L.bk, &L.bv});
    d.wo = cuda::upload_weight({&L.wo});
    d.ffn_norm = upload_bf16({&L.ffn_norm});
    d.w_gu = cuda::upload_weight({&L.w_gate, &L.w_up});
    d.w_down = cuda::upload_weight({&L.w_down});
    m.layers.push_back(std::move(d));
  }
  m.init_quant_scratch();
  m.decide_fused_decode();
  m.decide_attn_o();
  m.decide_megakernel();
}

std::unique_ptr<CudaBackend> CudaBackend::random(const ModelConfig& config, uint64_t seed, float scale,
                                                 CudaBackendOptions options, QuantFormat quant, QuantFormat head_quant) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(config, options, 0));
  Impl& m = *b->impl_;
  const ModelConfig& c = m.c;
  cudaStream_t s = m.s();
  // Fills `parts` (stream id, element count) one after another into a new buffer.
  auto make = [&](std::initializer_list<std::pair<uint64_t, int64_t>> parts) {
    int64_t total = 0;
    for (auto& p : parts) total += p.second;
    DeviceBuffer<bf16> buf{size_t(total)};
    int64_t at = 0;
    for (auto& p : parts) {
      cuda::fill_random_bf16(buf.data() + at, p.second, seed, p.first, 0, scale, s);
      at += p.second;
    }
    return buf;
  };
  // A projection of `cols` inputs stacked from `parts` (stream id, rows), in the requested format
  // (as `kiln quantize` does, the layers' projections; the head in head_quant; the embedding stays).
  auto proj = [&](int64_t cols, std::initializer_list<std::pair<uint64_t, int64_t>> parts, QuantFormat f) {
    return cuda::random_weight(f, cols, parts, seed, scale, s);
  };
  using namespace rng_tensor;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  m.embed = make({{embed, c.vocab_size * H}});
  m.final_norm = make({{final_norm, H}});
  KILN_CHECK(head_quant == QuantFormat::none || !c.tied_embeddings, invalid_argument,
             "a quantized head needs an untied one: {} ties its head to the embedding", c.name);
  if (!c.tied_embeddings) m.lm_head = proj(H, {{lm_head, c.vocab_size}}, head_quant);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    DeviceLayer d;
    d.attn_norm = make({{layer(l, attn_norm), H}});
    d.w_qkv = proj(H, {{layer(l, wq), c.q_dim()}, {layer(l, wk), c.kv_dim()}, {layer(l, wv), c.kv_dim()}}, quant);
    if (c.qkv_bias) d.b_qkv = make({{layer(l, bq), c.q_dim()}, {layer(l, bk), c.kv_dim()}, {layer(l, bv), c.kv_dim()}});
    d.wo = proj(c.q_dim(), {{layer(l, wo), H}}, quant);
    d.ffn_norm = make({{layer(l, ffn_norm), H}});
    d.w_gu = proj(H, {{layer(l, w_gate), I}, {layer(l, w_up), I}}, quant);
    d.w_down = proj(I, {{layer(l, w_down), H}}, quant);
    m.layers.push_back(std::move(d));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  m.init_quant_scratch();
  m.decide_fused_decode();
  m.decide_attn_o();
  m.decide_megakernel();
  return b;
}

CudaBackend::~CudaBackend() = default;

const ModelConfig& CudaBackend::config() const { return impl_->c; }

std::unique_ptr<KvSequence> CudaBackend::new_sequence(int64_t capacity) {
  KILN_CHECK(capacity > 0, invalid_argument, "KV capacity must be positive, got {}", capacity);
  KILN_CHECK(capacity < (int64_t(1) << 31), invalid_argument, "KV capacity {} is too large", capacity);
  return std::make_unique<CudaKvSequence>(impl_->c, capacity, Impl::kv_quant_of(kv_cache_format()));
}

bool CudaBackend::supports_kv_cache_format(KvCacheFormat f) const {
  if (f == KvCacheFormat::native) return true;
  return (f == KvCacheFormat::int8 || f == KvCacheFormat::fp8) && cuda::kv_quant_supported(int(impl_->c.head_dim));
}

int64_t CudaBackend::kv_bytes_per_element() const { return kv_cache_format() == KvCacheFormat::native ? 2 : 1; }

int64_t CudaBackend::kv_bytes_per_token() const {
  const ModelConfig& c = impl_->c;
  const int64_t scales = kv_cache_format() == KvCacheFormat::native ? 0 : 2 * c.n_layers * c.n_kv_heads * 4;
  return 2 * c.n_layers * c.kv_dim() * kv_bytes_per_element() + scales;
}

void CudaBackend::forward_impl(KvSequence& seq_base, std::span<const int32_t> tokens, bool all_logits,
                               std::vector<float>& logits) {
  auto& seq = dynamic_cast<CudaKvSequence&>(seq_base);
  Impl& m = *impl_;
  const int64_t n = int64_t(tokens.size());
  logits.clear();
  for (int64_t at = 0; at < n; at += m.opt.max_chunk) {
    int64_t len = std::min(m.opt.max_chunk, n - at);
    bool last = at + len == n;
    // An inner chunk's logits are not wanted unless all_logits.
    run_chunk(m, seq, tokens.subspan(size_t(at), size_t(len)), all_logits, all_logits || last ? &logits : nullptr);
  }
}

std::span<float> CudaBackend::forward_last_impl(KvSequence& seq_base, std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  if (!takes_decode_graph(m, int64_t(tokens.size())) || (Impl::decode_probe() & Impl::kProbeCopyLogits))
    return Backend::forward_last_impl(seq_base, tokens);
  auto& seq = dynamic_cast<CudaKvSequence&>(seq_base);
  decode_graph(m, seq, tokens[0]);
  seq.advance(1);
  return {m.host_logits.data(), size_t(m.c.vocab_size)};
}

void CudaBackend::set_use_graphs(bool on) { impl_->opt.use_graphs = on; }
bool CudaBackend::use_graphs() const { return impl_->opt.use_graphs; }

bool CudaBackend::samples_on_device() const {
  static const bool on = env_switch_on("KILN_DEVICE_SAMPLING");
  return on;
}
void CudaBackend::set_profiling(bool on) { impl_->set_profiling(on); }
std::string CudaBackend::profiling_timer() const { return impl_->timer_note; }
bool CudaBackend::profiling_has_kernel_records() const { return impl_->cupti != nullptr; }
void CudaBackend::reset_kernel_stats() {
  impl_->stats.clear();
  impl_->last_trace.clear();
}

std::vector<profile::TraceEvent> CudaBackend::last_step_trace() const { return impl_->last_trace; }

std::vector<KernelStat> CudaBackend::kernel_stats() const {
  std::vector<KernelStat> out;
  for (auto& [name, st] : impl_->stats) out.push_back(st);
  std::sort(out.begin(), out.end(), [](const KernelStat& a, const KernelStat& b) { return a.total_ms > b.total_ms; });
  return out;
}

int64_t CudaBackend::weight_bytes() const {
  const Impl& m = *impl_;
  int64_t total = int64_t(m.embed.bytes() + m.final_norm.bytes() + m.lm_head.bytes());
  for (const DeviceLayer& d : m.layers)
    total += int64_t(d.attn_norm.bytes() + d.w_qkv.bytes() + d.b_qkv.bytes() + d.wo.bytes() + d.ffn_norm.bytes() +
                     d.w_gu.bytes() + d.w_down.bytes());
  return total;
}

}  // namespace kiln
