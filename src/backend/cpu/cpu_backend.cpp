#include "backend/cpu/cpu_backend.h"

#include <algorithm>

#include "backend/cpu/ops.h"
#include "core/check.h"

namespace kiln {
namespace {

// Keys and values of one sequence, contiguous: k[layer] is (capacity, n_kv_heads, head_dim).
class CpuKvSequence final : public KvSequence {
 public:
  CpuKvSequence(const ModelConfig& c, int64_t capacity) : KvSequence(capacity) {
    size_t per_layer = size_t(capacity * c.kv_dim());
    k.assign(size_t(c.n_layers), std::vector<float>(per_layer));
    v.assign(size_t(c.n_layers), std::vector<float>(per_layer));
  }
  void advance(int64_t n) { n_past_ += n; }
  std::vector<std::vector<float>> k, v;
};

}  // namespace

CpuBackend::CpuBackend(ModelConfig config, ModelWeights weights, ThreadPool& pool)
    : config_(std::move(config)), weights_(std::move(weights)), pool_(pool) {}

std::unique_ptr<KvSequence> CpuBackend::new_sequence(int64_t capacity) {
  KILN_CHECK(capacity > 0, invalid_argument, "KV capacity must be positive, got {}", capacity);
  return std::make_unique<CpuKvSequence>(config_, capacity);
}

void CpuBackend::forward_impl(KvSequence& seq_base, std::span<const int32_t> tokens, bool all_logits,
                              std::vector<float>& logits) {
  auto& seq = dynamic_cast<CpuKvSequence&>(seq_base);
  const ModelConfig& c = config_;
  const int64_t n = int64_t(tokens.size()), start = seq.n_past(), hidden = c.hidden_size;

  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[size_t(i)] = int32_t(start + i);

  // Activations, (n, features) each.
  std::vector<float> x(size_t(n * hidden)), xn(x.size()), q(size_t(n * c.q_dim())), attn(q.size());
  std::vector<float> gate(size_t(n * c.intermediate_size)), up(gate.size()), proj(x.size());
  for (int64_t i = 0; i < n; ++i) std::copy_n(weights_.embed.row(tokens[size_t(i)]), hidden, x.data() + i * hidden);

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = weights_.layers[size_t(l)];
    float* k_cache = seq.k[size_t(l)].data();
    float* v_cache = seq.v[size_t(l)].data();
    float* k_new = k_cache + start * c.kv_dim();
    float* v_new = v_cache + start * c.kv_dim();
    auto bias = [](const HostMatrix& b) { return b.empty() ? nullptr : b.data.data(); };

    // Attention block: x += wo * attention(rope(wq * norm(x)), cache + rope(wk * norm(x)), ...)
    cpu::rmsnorm(x.data(), L.attn_norm.data.data(), xn.data(), n, hidden, c.rms_eps);
    cpu::matmul(pool_, xn.data(), L.wq.data.data(), bias(L.bq), q.data(), n, c.q_dim(), hidden);
    cpu::matmul(pool_, xn.data(), L.wk.data.data(), bias(L.bk), k_new, n, c.kv_dim(), hidden);
    cpu::matmul(pool_, xn.data(), L.wv.data.data(), bias(L.bv), v_new, n, c.kv_dim(), hidden);
    cpu::rope(q.data(), positions.data(), n, c.n_heads, c.head_dim, c.rope);
    cpu::rope(k_new, positions.data(), n, c.n_kv_heads, c.head_dim, c.rope);
    cpu::attention(q.data(), k_cache, v_cache, attn.data(), n, start, c.n_heads, c.n_kv_heads, c.head_dim);
    cpu::matmul(pool_, attn.data(), L.wo.data.data(), nullptr, proj.data(), n, hidden, c.q_dim());
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];

    // MLP block: x += w_down * (silu(w_gate * norm(x)) * (w_up * norm(x)))
    cpu::rmsnorm(x.data(), L.ffn_norm.data.data(), xn.data(), n, hidden, c.rms_eps);
    cpu::matmul(pool_, xn.data(), L.w_gate.data.data(), nullptr, gate.data(), n, c.intermediate_size, hidden);
    cpu::matmul(pool_, xn.data(), L.w_up.data.data(), nullptr, up.data(), n, c.intermediate_size, hidden);
    cpu::silu_mul(gate.data(), up.data(), gate.data(), n * c.intermediate_size);
    cpu::matmul(pool_, gate.data(), L.w_down.data.data(), nullptr, proj.data(), n, hidden, c.intermediate_size);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  seq.advance(n);

  int64_t first_out = all_logits ? 0 : n - 1, n_out = n - first_out;
  cpu::rmsnorm(x.data() + first_out * hidden, weights_.final_norm.data.data(), xn.data(), n_out, hidden, c.rms_eps);
  logits.resize(size_t(n_out * c.vocab_size));
  cpu::matmul(pool_, xn.data(), weights_.output().data.data(), nullptr, logits.data(), n_out, c.vocab_size, hidden);
}

}  // namespace kiln
