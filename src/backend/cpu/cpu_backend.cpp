#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <numeric>

#include "backend/cpu/ops.h"
#include "core/check.h"
#include "core/dtype.h"
#include "quant/quantize.h"

namespace kiln {

// k[layer] and v[layer]: (num_blocks, block_size, n_kv_heads, head_dim) fp32.
class CpuKvPool final : public KvPool {
 public:
  CpuKvPool(const ModelConfig& c, int32_t num_blocks, int32_t block_size)
      : KvPool(num_blocks, block_size), kv_dim(c.kv_dim()) {
    const size_t per_layer = size_t(num_blocks) * size_t(block_size) * size_t(kv_dim);
    k.assign(size_t(c.n_layers), std::vector<float>(per_layer));
    v.assign(size_t(c.n_layers), std::vector<float>(per_layer));
  }
  float* row(std::vector<float>& cache, int32_t block, int64_t slot) {
    return cache.data() + (int64_t(block) * block_size() + slot) * kv_dim;
  }
  int64_t kv_dim;
  std::vector<std::vector<float>> k, v;
};

namespace {

// A sequence's private cache: one block of `capacity` positions.
class CpuKvSequence final : public KvSequence {
 public:
  CpuKvSequence(const ModelConfig& c, int64_t capacity) : KvSequence(capacity), pool(c, 1, int32_t(capacity)) {}
  void advance(int64_t n) { n_past_ += n; }
  CpuKvPool pool;
};

// Whether the table's blocks are consecutive, so positions 0.. are contiguous in the pool.
bool contiguous(std::span<const int32_t> table, int64_t n_blocks) {
  for (int64_t i = 1; i < n_blocks; ++i)
    if (table[size_t(i)] != table[0] + i) return false;
  return true;
}

}  // namespace

CpuBackend::CpuBackend(ModelConfig config, ModelWeights weights, ThreadPool& pool)
    : config_(std::move(config)), weights_(std::move(weights)), pool_(pool) {}

std::unique_ptr<KvSequence> CpuBackend::new_sequence(int64_t capacity) {
  KILN_CHECK(capacity > 0 && capacity <= INT32_MAX, invalid_argument, "KV capacity must be in 1..2^31-1, got {}",
             capacity);
  return std::make_unique<CpuKvSequence>(config_, capacity);
}

std::unique_ptr<KvPool> CpuBackend::new_kv_pool(int32_t num_blocks, int32_t block_size) {
  KILN_CHECK(num_blocks > 0 && block_size > 0, invalid_argument, "a KV pool needs blocks ({}) of positive size ({})",
             num_blocks, block_size);
  return std::make_unique<CpuKvPool>(config_, num_blocks, block_size);
}

void CpuBackend::forward_impl(KvSequence& seq_base, std::span<const int32_t> tokens, bool all_logits,
                              std::vector<float>& logits) {
  auto& seq = dynamic_cast<CpuKvSequence&>(seq_base);
  const int32_t block0 = 0;
  const BatchEntry entry{tokens, seq.n_past(), std::span<const int32_t>(&block0, 1), true};
  run(seq.pool, std::span<const BatchEntry>(&entry, 1), all_logits, logits);
  seq.advance(int64_t(tokens.size()));
}

void CpuBackend::forward_batch_impl(KvPool& pool, std::span<const BatchEntry> entries, std::vector<float>& logits,
                                    std::vector<int32_t>* argmax) {
  run(dynamic_cast<CpuKvPool&>(pool), entries, false, logits);
  if (argmax) host_argmax(logits, *argmax);
}

void CpuBackend::linear(const float* x, const HostMatrix& w, const float* bias, float* y, int64_t rows) {
  if (w.quant.format == QuantFormat::fp8) {
    act_scratch_.assign(x, x + rows * w.cols);
    quant::fake_quantize(QuantFormat::fp8, act_scratch_.data(), rows, w.cols);
    x = act_scratch_.data();
  }
  cpu::matmul(pool_, x, w.data.data(), bias, y, rows, w.rows, w.cols);
}

void CpuBackend::store_format(float* kv, int64_t rows) const {
  const ModelConfig& c = config_;
  switch (kv_cache_format()) {
    case KvCacheFormat::native: return;
    case KvCacheFormat::bf16:
      for (int64_t i = 0; i < rows * c.kv_dim(); ++i) kv[i] = round_to_bf16(kv[i]);
      return;
    case KvCacheFormat::int8: quant::fake_quantize(QuantFormat::int8, kv, rows * c.n_kv_heads, c.head_dim); return;
    case KvCacheFormat::fp8: quant::fake_quantize(QuantFormat::fp8, kv, rows * c.n_kv_heads, c.head_dim); return;
  }
}

void CpuBackend::run(CpuKvPool& kv, std::span<const BatchEntry> entries, bool all_positions,
                     std::vector<float>& logits) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, kv_dim = c.kv_dim(), bs = kv.block_size();

  // Row r of the activations is token r of the entries laid end to end.
  std::vector<int64_t> first_row(entries.size() + 1, 0);
  for (size_t e = 0; e < entries.size(); ++e) first_row[e + 1] = first_row[e] + int64_t(entries[e].tokens.size());
  const int64_t n = first_row.back();
  std::vector<int32_t> positions(static_cast<size_t>(n)), block_of(static_cast<size_t>(n));
  std::vector<int64_t> slot_of(static_cast<size_t>(n));
  for (size_t e = 0; e < entries.size(); ++e) {
    for (int64_t i = 0; i < int64_t(entries[e].tokens.size()); ++i) {
      const int64_t r = first_row[e] + i, p = entries[e].first_position + i;
      positions[size_t(r)] = int32_t(p);
      block_of[size_t(r)] = entries[e].block_table[size_t(p / bs)];
      slot_of[size_t(r)] = p % bs;
    }
  }

  std::vector<float> x(size_t(n * hidden)), xn(x.size()), q(size_t(n * c.q_dim())), attn(q.size());
  std::vector<float> k_new(size_t(n * kv_dim)), v_new(k_new.size());
  std::vector<float> gate(size_t(n * c.intermediate_size)), up(gate.size()), proj(x.size());
  for (size_t e = 0; e < entries.size(); ++e) {
    for (size_t i = 0; i < entries[e].tokens.size(); ++i)
      std::copy_n(weights_.embed.row(entries[e].tokens[i]), hidden, x.data() + (first_row[e] + int64_t(i)) * hidden);
  }
  auto bias = [](const HostMatrix& b) { return b.empty() ? nullptr : b.data.data(); };

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = weights_.layers[size_t(l)];
    std::vector<float>& k_cache = kv.k[size_t(l)];
    std::vector<float>& v_cache = kv.v[size_t(l)];

    // Attention block: x += wo * attention(rope(wq * norm(x)), cache + rope(wk * norm(x)), ...)
    cpu::rmsnorm(x.data(), L.attn_norm.data.data(), xn.data(), n, hidden, c.rms_eps);
    if (observer_) observer_(l, LinearSite::attn_in, xn.data(), n, hidden);
    linear(xn.data(), L.wq, bias(L.bq), q.data(), n);
    linear(xn.data(), L.wk, bias(L.bk), k_new.data(), n);
    linear(xn.data(), L.wv, bias(L.bv), v_new.data(), n);
    cpu::rope(q.data(), positions.data(), n, c.n_heads, c.head_dim, c.rope);
    cpu::rope(k_new.data(), positions.data(), n, c.n_kv_heads, c.head_dim, c.rope);
    store_format(k_new.data(), n);  // what the cache holds is what attention reads
    store_format(v_new.data(), n);
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(k_new.data() + r * kv_dim, kv_dim, kv.row(k_cache, block_of[size_t(r)], slot_of[size_t(r)]));
      std::copy_n(v_new.data() + r * kv_dim, kv_dim, kv.row(v_cache, block_of[size_t(r)], slot_of[size_t(r)]));
    }
    // Each sequence attends to its own positions, read through its block table (gathered into
    // one contiguous run unless its blocks already are one); sequences in parallel.
    pool_.parallel_for(int64_t(entries.size()), [&](int64_t begin, int64_t end) {
      std::vector<float> k_seq, v_seq;
      for (int64_t e = begin; e < end; ++e) {
        const BatchEntry& b = entries[size_t(e)];
        const int64_t n_q = int64_t(b.tokens.size()), len = b.first_position + n_q, n_blocks = (len + bs - 1) / bs;
        const float *k_run = nullptr, *v_run = nullptr;
        if (contiguous(b.block_table, n_blocks)) {
          k_run = kv.row(k_cache, b.block_table[0], 0);
          v_run = kv.row(v_cache, b.block_table[0], 0);
        } else {
          k_seq.resize(size_t(len * kv_dim));
          v_seq.resize(size_t(len * kv_dim));
          for (int64_t p = 0; p < len; p += bs) {
            const int64_t count = std::min(bs, len - p) * kv_dim;
            std::copy_n(kv.row(k_cache, b.block_table[size_t(p / bs)], 0), count, k_seq.data() + p * kv_dim);
            std::copy_n(kv.row(v_cache, b.block_table[size_t(p / bs)], 0), count, v_seq.data() + p * kv_dim);
          }
          k_run = k_seq.data();
          v_run = v_seq.data();
        }
        const int64_t row = first_row[size_t(e)];
        cpu::attention(q.data() + row * c.q_dim(), k_run, v_run, attn.data() + row * c.q_dim(), n_q, b.first_position,
                       c.n_heads, c.n_kv_heads, c.head_dim);
      }
    });
    if (observer_) observer_(l, LinearSite::attn_out, attn.data(), n, c.q_dim());
    linear(attn.data(), L.wo, nullptr, proj.data(), n);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];

    // MLP block: x += w_down * (silu(w_gate * norm(x)) * (w_up * norm(x)))
    cpu::rmsnorm(x.data(), L.ffn_norm.data.data(), xn.data(), n, hidden, c.rms_eps);
    if (observer_) observer_(l, LinearSite::mlp_in, xn.data(), n, hidden);
    linear(xn.data(), L.w_gate, nullptr, gate.data(), n);
    linear(xn.data(), L.w_up, nullptr, up.data(), n);
    cpu::silu_mul(gate.data(), up.data(), gate.data(), n * c.intermediate_size);
    if (observer_) observer_(l, LinearSite::mlp_act, gate.data(), n, c.intermediate_size);
    linear(gate.data(), L.w_down, nullptr, proj.data(), n);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }

  // The rows that get logits: every row (all_positions), else each wanting entry's last.
  std::vector<int64_t> out_rows;
  if (all_positions) {
    out_rows.resize(size_t(n));
    std::iota(out_rows.begin(), out_rows.end(), 0);
  } else {
    for (size_t e = 0; e < entries.size(); ++e)
      if (entries[e].want_logits) out_rows.push_back(first_row[e + 1] - 1);
  }
  const int64_t n_out = int64_t(out_rows.size());
  std::vector<float> last(size_t(n_out * hidden));
  for (int64_t i = 0; i < n_out; ++i)
    std::copy_n(x.data() + out_rows[size_t(i)] * hidden, hidden, last.data() + i * hidden);
  cpu::rmsnorm(last.data(), weights_.final_norm.data.data(), xn.data(), n_out, hidden, c.rms_eps);
  logits.resize(size_t(n_out * c.vocab_size));
  if (n_out > 0)
    linear(xn.data(), weights_.output(), nullptr, logits.data(), n_out);
}

}  // namespace kiln
