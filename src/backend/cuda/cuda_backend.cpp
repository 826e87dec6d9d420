#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "core/check.h"
#include "core/dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/random_fill.h"
#include "model/random_weights.h"
#include "profile/cost_model.h"

namespace kiln {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::OutMode;

namespace {

// ---- weights ---------------------------------------------------------------------------------

struct DeviceLayer {
  DeviceBuffer<bf16> attn_norm;  // (hidden)
  DeviceBuffer<bf16> w_qkv;      // (q_dim + 2 kv_dim, hidden): wq, wk, wv stacked
  DeviceBuffer<bf16> b_qkv;      // (q_dim + 2 kv_dim) or empty
  DeviceBuffer<bf16> wo;         // (hidden, q_dim)
  DeviceBuffer<bf16> ffn_norm;   // (hidden)
  DeviceBuffer<bf16> w_gu;       // (2 inter, hidden): w_gate, w_up stacked
  DeviceBuffer<bf16> w_down;     // (hidden, inter)
};

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
  CudaKvSequence(const ModelConfig& c, int64_t capacity)
      : KvSequence(capacity),
        k(size_t(c.n_layers * capacity * c.kv_dim())),
        v(k.size()),
        workspace(size_t(cuda::decode_workspace_floats(1, int(c.n_heads), int(c.head_dim), capacity))) {}
  ~CudaKvSequence() override {
    if (graph) cudaGraphExecDestroy(graph);
  }
  void advance(int64_t n) { n_past_ += n; }
  cuda::KvLayout layer(const ModelConfig& c, int64_t l) const {
    int64_t per_layer = capacity_ * c.kv_dim();
    return cuda::KvLayout{k.data() + l * per_layer, v.data() + l * per_layer, per_layer * c.n_layers, c.kv_dim(),
                          int(c.head_dim)};
  }

  DeviceBuffer<bf16> k, v;          // (n_layers, capacity, n_kv_heads, head_dim) each
  DeviceBuffer<float> workspace;    // flash-decoding partials, sized for the capacity
  cudaGraphExec_t graph = nullptr;  // the captured decode step of this sequence
};

}  // namespace

// ---- the backend's state ---------------------------------------------------------------------

struct CudaBackend::Impl {
  ModelConfig c;
  CudaBackendOptions opt;
  cuda::Stream stream;
  DeviceBuffer<bf16> embed, final_norm, lm_head;  // lm_head empty when tied
  std::vector<DeviceLayer> layers;
  DeviceBuffer<float> inv_freq;  // (rot_dim / 2), llama3 scaling applied on the host

  // Activations for max_chunk tokens, carved from one allocation (never reallocated: captured
  // graphs hold these addresses).
  DeviceBuffer<char> arena;
  float* x = nullptr;      // (C, hidden) fp32 residual stream
  bf16* xn = nullptr;      // (C, hidden) normed input of the next projection
  bf16* qkv = nullptr;     // (C, q_dim + 2 kv_dim)
  bf16* q = nullptr;       // (C, q_dim) rotated queries
  bf16* attn = nullptr;    // (C, q_dim) attention output
  bf16* gu = nullptr;      // (C, 2 inter) [gate | up]
  bf16* h = nullptr;       // (C, inter)
  float* logits = nullptr; // (C, vocab)
  int32_t* ints = nullptr; // tokens (C) | positions (C) | kv_len (1)
  int32_t* host_ints = nullptr;  // pinned staging of `ints`
  float* host_logits = nullptr;  // pinned (vocab): the decode graph's output

  bool profiling = false;
  struct Pending {
    std::string name;
    double bytes, flops;
    cudaEvent_t a, b;
  };
  std::vector<Pending> pending;
  std::vector<cudaEvent_t> event_pool;
  size_t events_used = 0;
  std::map<std::string, KernelStat> stats;

  Impl(ModelConfig config, CudaBackendOptions o) : c(std::move(config)), opt(o) {}
  ~Impl() {
    if (host_ints) cudaFreeHost(host_ints);
    if (host_logits) cudaFreeHost(host_logits);
    for (cudaEvent_t e : event_pool) cudaEventDestroy(e);
  }

  int64_t qkv_dim() const { return c.q_dim() + 2 * c.kv_dim(); }
  const bf16* output_weight() const { return lm_head.size() ? lm_head.data() : embed.data(); }
  cudaStream_t s() const { return stream.get(); }

  void init_common() {
    c.validate();
    KILN_CHECK(c.head_dim % 8 == 0 && c.head_dim <= cuda::kAttnMaxHeadDim, unsupported,
               "the CUDA backend supports head dims that are multiples of 8 up to {}, not {}", cuda::kAttnMaxHeadDim,
               c.head_dim);
    KILN_CHECK(opt.max_chunk >= 1, invalid_argument, "max_chunk must be positive");
    std::vector<float> f(size_t(c.rope.rot_dim / 2));
    for (int i = 0; i < c.rope.rot_dim / 2; ++i) f[size_t(i)] = cpu::rope_inv_freq(c.rope, i);
    inv_freq = DeviceBuffer<float>(f);

    const int64_t C = opt.max_chunk;
    size_t offset = 0;
    auto carve = [&](size_t bytes) {
      size_t at = offset;
      offset += (bytes + 255) / 256 * 256;  // 256-byte aligned slices: 16-byte vector loads stay legal
      return at;
    };
    size_t o_x = carve(C * c.hidden_size * 4), o_xn = carve(C * c.hidden_size * 2), o_qkv = carve(C * qkv_dim() * 2),
           o_q = carve(C * c.q_dim() * 2), o_attn = carve(C * c.q_dim() * 2),
           o_gu = carve(C * 2 * c.intermediate_size * 2), o_h = carve(C * c.intermediate_size * 2),
           o_logits = carve(C * c.vocab_size * 4), o_ints = carve((2 * C + 1) * 4);
    arena = DeviceBuffer<char>(offset);
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
    KILN_CUDA_CHECK(cudaMallocHost(&host_ints, size_t(2 * C + 1) * 4));
    KILN_CUDA_CHECK(cudaMallocHost(&host_logits, size_t(c.vocab_size) * 4));
  }

  // ---- launches, timed when profiling ----
  template <class F>
  void op(const std::string& name, profile::Cost cost, F&& launch) {
    const double bytes = cost.bytes, flops = cost.flops;
    if (!profiling) return launch();
    while (event_pool.size() < events_used + 2) {
      cudaEvent_t e;
      KILN_CUDA_CHECK(cudaEventCreate(&e));
      event_pool.push_back(e);
    }
    cudaEvent_t a = event_pool[events_used++], b = event_pool[events_used++];
    KILN_CUDA_CHECK(cudaEventRecord(a, s()));
    launch();
    KILN_CUDA_CHECK(cudaEventRecord(b, s()));
    pending.push_back({name, bytes, flops, a, b});
  }

  void collect_timings() {  // after the stream is synchronized
    for (const Pending& p : pending) {
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, p.a, p.b));
      KernelStat& st = stats[p.name];
      st.name = p.name;
      st.calls += 1;
      st.total_ms += ms;
      st.bytes += p.bytes;
      st.flops += p.flops;
    }
    pending.clear();
    events_used = 0;
  }

  void linear(const char* what, const bf16* in, const bf16* w, const bf16* bias, void* out, OutMode mode, int64_t m,
              int64_t n, int64_t k) {
    std::string name = std::string(what) + (m <= cuda::kGemvMaxRows ? ".gemv" : ".gemm");
    double out_bytes = mode == OutMode::store_bf16 ? 2 : mode == OutMode::store_f32 ? 4 : 8;  // add_f32: read + write
    op(name, profile::linear(m, n, k, out_bytes), [&] { cuda::matmul(in, w, bias, out, mode, m, n, k, s()); });
  }

  // Enqueues the forward of n tokens at positions start.. (tokens, positions and kv_len already in
  // `ints` on the device) and the logits of rows out_first .. n-1 into `logits`.
  void enqueue(CudaKvSequence& seq, int64_t n, int64_t start, int64_t out_first) {
    const int64_t H = c.hidden_size, I = c.intermediate_size, C = opt.max_chunk;
    const int32_t* tokens = ints;
    const int32_t* positions = ints + C;
    const int32_t* kv_len = ints + 2 * C;
    op("embed", profile::embed(n, H), [&] { cuda::embed_gather(embed.data(), tokens, x, n, H, s()); });
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const DeviceLayer& L = layers[size_t(l)];
      const cuda::KvLayout kv = seq.layer(c, l);
      op("rmsnorm", profile::rmsnorm(n, H), [&] { cuda::rmsnorm(x, nullptr, L.attn_norm.data(), xn, n, H, c.rms_eps, s()); });
      linear("qkv", xn, L.w_qkv.data(), L.b_qkv.size() ? L.b_qkv.data() : nullptr, qkv, OutMode::store_bf16, n,
             qkv_dim(), H);
      op("rope_qkv", profile::rope_qkv(n, c), [&] {
           cuda::rope_qkv(qkv, positions, nullptr, n, inv_freq.data(), c.rope.rot_dim,
                          c.rope.style == RopeStyle::interleaved, int(c.n_heads), int(c.n_kv_heads), int(c.head_dim), q,
                          kv, s());
         });
      if (n == 1) {
        // start is for the analytic count only; the kernel reads the length from kv_len (graph replay)
        op("attention.decode", profile::attention(1, start, c), [&] {
          cuda::attention_decode(q, kv, kv_len, seq.capacity(), attn,
                                 cuda::decode_workspace(seq.workspace.data(), 1, int(c.n_heads), int(c.head_dim),
                                                        seq.capacity()),
                                 1, int(c.n_heads), int(c.n_kv_heads), int(c.head_dim), s());
        });
      } else {
        op("attention.prefill", profile::attention(n, start, c), [&] {
             cuda::attention_prefill(q, kv, attn, n, start, int(c.n_heads), int(c.n_kv_heads), int(c.head_dim), s());
           });
      }
      linear("o", attn, L.wo.data(), nullptr, x, OutMode::add_f32, n, H, c.q_dim());
      op("rmsnorm", profile::rmsnorm(n, H), [&] { cuda::rmsnorm(x, nullptr, L.ffn_norm.data(), xn, n, H, c.rms_eps, s()); });
      linear("gate_up", xn, L.w_gu.data(), nullptr, gu, OutMode::store_bf16, n, 2 * I, H);
      op("silu_mul", profile::silu_mul(n, I), [&] { cuda::silu_mul(gu, h, n, I, s()); });
      linear("down", h, L.w_down.data(), nullptr, x, OutMode::add_f32, n, H, I);
    }
    const int64_t n_out = n - out_first;
    op("rmsnorm", profile::rmsnorm(n_out, H), [&] { cuda::rmsnorm(x + out_first * H, nullptr, final_norm.data(), xn, n_out, H, c.rms_eps, s()); });
    linear("lm_head", xn, output_weight(), nullptr, logits, OutMode::store_f32, n_out, c.vocab_size, H);
  }

  void stage_ints(std::span<const int32_t> tokens, int64_t start) {
    const int64_t C = opt.max_chunk, n = int64_t(tokens.size());
    for (int64_t i = 0; i < n; ++i) {
      host_ints[i] = tokens[size_t(i)];
      host_ints[C + i] = int32_t(start + i);
    }
    host_ints[2 * C] = int32_t(start + n);
  }
  void copy_ints_to_device() {
    KILN_CUDA_CHECK(cudaMemcpyAsync(ints, host_ints, size_t(2 * opt.max_chunk + 1) * 4, cudaMemcpyHostToDevice, s()));
  }

  // One decode step through the sequence's graph (captured on first use).
  void decode_graph(CudaKvSequence& seq, int32_t token, std::vector<float>& out) {
    stage_ints(std::span<const int32_t>(&token, 1), seq.n_past());
    if (!seq.graph) {
      cudaGraph_t graph = nullptr;
      KILN_CUDA_CHECK(cudaStreamBeginCapture(s(), cudaStreamCaptureModeThreadLocal));
      try {
        copy_ints_to_device();
        enqueue(seq, 1, seq.n_past(), 0);
        KILN_CUDA_CHECK(cudaMemcpyAsync(host_logits, logits, size_t(c.vocab_size) * 4, cudaMemcpyDeviceToHost, s()));
      } catch (...) {
        cudaStreamEndCapture(s(), &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      KILN_CUDA_CHECK(cudaStreamEndCapture(s(), &graph));
      cudaError_t err = cudaGraphInstantiate(&seq.graph, graph, 0);
      cudaGraphDestroy(graph);
      KILN_CUDA_CHECK(err);
    }
    KILN_CUDA_CHECK(cudaGraphLaunch(seq.graph, s()));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s()));
    out.insert(out.end(), host_logits, host_logits + c.vocab_size);
  }

  // A chunk of at most max_chunk tokens; appends the logits of its last token, or of all its tokens.
  void run_chunk(CudaKvSequence& seq, std::span<const int32_t> tokens, bool all_logits, std::vector<float>& out) {
    const int64_t n = int64_t(tokens.size()), start = seq.n_past();
    if (n == 1 && opt.use_graphs && !profiling) {
      decode_graph(seq, tokens[0], out);
    } else {
      stage_ints(tokens, start);
      copy_ints_to_device();
      const int64_t out_first = all_logits ? 0 : n - 1, n_out = n - out_first;
      enqueue(seq, n, start, out_first);
      size_t at = out.size();
      out.resize(at + size_t(n_out * c.vocab_size));
      KILN_CUDA_CHECK(cudaMemcpyAsync(out.data() + at, logits, size_t(n_out * c.vocab_size) * 4,
                                      cudaMemcpyDeviceToHost, s()));
      KILN_CUDA_CHECK(cudaStreamSynchronize(s()));
      if (profiling) collect_timings();
    }
    seq.advance(n);
  }
};

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
  if (!w.lm_head.empty()) m.lm_head = upload_bf16({&w.lm_head});
  for (const LayerWeights& L : w.layers) {
    DeviceLayer d;
    d.attn_norm = upload_bf16({&L.attn_norm});
    d.w_qkv = upload_bf16({&L.wq, &L.wk, &L.wv});
    if (!L.bq.empty()) d.b_qkv = upload_bf16({&L.bq, &L.bk, &L.bv});
    d.wo = upload_bf16({&L.wo});
    d.ffn_norm = upload_bf16({&L.ffn_norm});
    d.w_gu = upload_bf16({&L.w_gate, &L.w_up});
    d.w_down = upload_bf16({&L.w_down});
    m.layers.push_back(std::move(d));
  }
}

std::unique_ptr<CudaBackend> CudaBackend::random(const ModelConfig& config, uint64_t seed, float scale,
                                                 CudaBackendOptions options) {
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
  using namespace rng_tensor;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  m.embed = make({{embed, c.vocab_size * H}});
  m.final_norm = make({{final_norm, H}});
  if (!c.tied_embeddings) m.lm_head = make({{lm_head, c.vocab_size * H}});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    DeviceLayer d;
    d.attn_norm = make({{layer(l, attn_norm), H}});
    d.w_qkv = make({{layer(l, wq), c.q_dim() * H}, {layer(l, wk), c.kv_dim() * H}, {layer(l, wv), c.kv_dim() * H}});
    if (c.qkv_bias) d.b_qkv = make({{layer(l, bq), c.q_dim()}, {layer(l, bk), c.kv_dim()}, {layer(l, bv), c.kv_dim()}});
    d.wo = make({{layer(l, wo), H * c.q_dim()}});
    d.ffn_norm = make({{layer(l, ffn_norm), H}});
    d.w_gu = make({{layer(l, w_gate), I * H}, {layer(l, w_up), I * H}});
    d.w_down = make({{layer(l, w_down), H * I}});
    m.layers.push_back(std::move(d));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  return b;
}

CudaBackend::~CudaBackend() = default;

const ModelConfig& CudaBackend::config() const { return impl_->c; }

std::unique_ptr<KvSequence> CudaBackend::new_sequence(int64_t capacity) {
  KILN_CHECK(capacity > 0, invalid_argument, "KV capacity must be positive, got {}", capacity);
  KILN_CHECK(capacity < (int64_t(1) << 31), invalid_argument, "KV capacity {} is too large", capacity);
  return std::make_unique<CudaKvSequence>(impl_->c, capacity);
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
    if (!all_logits && !last) {
      std::vector<float> discard;  // an inner chunk's logits are not wanted: compute only the last row
      m.run_chunk(seq, tokens.subspan(size_t(at), size_t(len)), false, discard);
    } else {
      m.run_chunk(seq, tokens.subspan(size_t(at), size_t(len)), all_logits, logits);
    }
  }
}

void CudaBackend::set_use_graphs(bool on) { impl_->opt.use_graphs = on; }
bool CudaBackend::use_graphs() const { return impl_->opt.use_graphs; }
void CudaBackend::set_profiling(bool on) { impl_->profiling = on; }
void CudaBackend::reset_kernel_stats() { impl_->stats.clear(); }

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
