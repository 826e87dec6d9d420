#include "profile/cost_model.h"

namespace kiln::profile {

Cost linear(int64_t m, int64_t n, int64_t k, double out_bytes, const Widths& w) {
  return {w.weight * double(n) * double(k) + w.act * double(m) * double(k) + out_bytes * double(m) * double(n),
          2.0 * double(m) * double(n) * double(k)};
}

Cost embed(int64_t tokens, int64_t hidden, const Widths& w) {
  return {(w.weight + w.residual) * double(tokens) * double(hidden), 0};
}

Cost rmsnorm(int64_t rows, int64_t hidden, const Widths& w) {
  // square, sum, scale, weight: 4 FLOPs an element; the norm weight vector is negligible.
  return {(w.residual + w.act) * double(rows) * double(hidden), 4.0 * double(rows) * double(hidden)};
}

Cost rope_qkv(int64_t tokens, const ModelConfig& c, const Widths& w) {
  double qkv = double(c.q_dim() + 2 * c.kv_dim());
  // read the fused qkv row; write q and the new K/V rows (same element count); 3 FLOPs per rotated element.
  return {w.act * double(tokens) * qkv + (w.act * double(c.q_dim()) + w.kv * 2.0 * double(c.kv_dim())) * double(tokens),
          3.0 * double(tokens) * double(c.q_dim() + c.kv_dim())};
}

Cost silu_mul(int64_t tokens, int64_t intermediate, const Widths& w) {
  return {3.0 * w.act * double(tokens) * double(intermediate), 4.0 * double(tokens) * double(intermediate)};
}

Cost attention(int64_t n_new, int64_t past, const ModelConfig& c, const Widths& w) {
  double kv_rows = double(past + n_new);
  double pairs = double(n_new) * (double(past) + double(n_new + 1) / 2);  // (query, visible key) pairs
  return {w.kv * 2.0 * double(c.kv_dim()) * kv_rows + 2.0 * w.act * double(n_new) * double(c.q_dim()),
          4.0 * pairs * double(c.q_dim())};  // QK^T and PV: 2 FLOPs each per pair and dimension
}

std::vector<OpCost> step_ops(const ModelConfig& c, int64_t n, int64_t past, int64_t n_out, const Widths& w) {
  return batch_ops(c, {SeqShape{n, past}}, n_out, w);
}

std::vector<OpCost> batch_ops(const ModelConfig& c, const std::vector<SeqShape>& seqs, int64_t n_out,
                              const Widths& w) {
  int64_t n = 0;
  Cost decode, prefill;
  bool any_decode = false, any_prefill = false;
  for (const SeqShape& s : seqs) {
    n += s.n_new;
    const Cost a = attention(s.n_new, s.past, c, w);
    (s.n_new == 1 ? decode : prefill) += a;
    (s.n_new == 1 ? any_decode : any_prefill) = true;
  }
  const char* kind = n <= kGemvMaxRows ? ".gemv" : ".gemm";
  auto named = [&](const char* op) { return std::string(op) + kind; };
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  std::vector<OpCost> ops;
  const Widths pw = w.projections();
  ops.push_back({"embed", embed(n, H, w)});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    ops.push_back({"rmsnorm", rmsnorm(n, H, w)});
    ops.push_back({named("qkv"), linear(n, c.q_dim() + 2 * c.kv_dim(), H, w.act, pw)});
    ops.push_back({"rope_qkv", rope_qkv(n, c, w)});
    if (any_decode) ops.push_back({"attention.decode", decode});
    if (any_prefill) ops.push_back({"attention.prefill", prefill});
    ops.push_back({named("o"), linear(n, H, c.q_dim(), 2 * w.residual, pw)});
    ops.push_back({"rmsnorm", rmsnorm(n, H, w)});
    ops.push_back({named("gate_up"), linear(n, 2 * I, H, w.act, pw)});
    ops.push_back({"silu_mul", silu_mul(n, I, w)});
    ops.push_back({named("down"), linear(n, H, I, 2 * w.residual, pw)});
  }
  ops.push_back({"rmsnorm", rmsnorm(n_out, H, w)});
  ops.push_back({n_out <= kGemvMaxRows ? "lm_head.gemv" : "lm_head.gemm", linear(n_out, c.vocab_size, H, 4, w.head())});
  return ops;
}

Cost batch_cost(const ModelConfig& c, const std::vector<SeqShape>& seqs, int64_t n_out, const Widths& w) {
  Cost total;
  for (const auto& op : batch_ops(c, seqs, n_out, w)) total += op.cost;
  return total;
}

Cost step_cost(const ModelConfig& c, int64_t n_new, int64_t past, int64_t n_out, const Widths& w) {
  Cost total;
  for (const auto& op : step_ops(c, n_new, past, n_out, w)) total += op.cost;
  return total;
}

double weight_bytes(const ModelConfig& c, const Widths& w) { return w.weight * double(c.n_params()); }

}  // namespace kiln::profile
