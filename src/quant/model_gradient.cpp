#include "quant/model_gradient.h"

#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/check.h"

namespace kiln::quant {

HostMatrix& layer_matrix(LayerWeights& l, LayerMatrix m) {
  switch (m) {
    case LayerMatrix::q: return l.wq;
    case LayerMatrix::k: return l.wk;
    case LayerMatrix::v: return l.wv;
    case LayerMatrix::o: return l.wo;
    case LayerMatrix::gate: return l.w_gate;
    case LayerMatrix::up: return l.w_up;
    case LayerMatrix::down: return l.w_down;
  }
  KILN_FAIL(internal, "no such layer matrix");
}

namespace {

using Buffer = std::vector<float>;

Buffer transpose(const float* a, int64_t rows, int64_t cols) {
  Buffer t(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = a[i * cols + j];
  return t;
}

// y(n, out) = x(n, in) W^T (+ bias).
Buffer linear(ThreadPool& pool, const Buffer& x, const HostMatrix& w, const HostMatrix* bias, int64_t n) {
  Buffer y(size_t(n * w.rows));
  cpu::matmul(pool, x.data(), w.data.data(), bias && !bias->empty() ? bias->data.data() : nullptr, y.data(), n,
              w.rows, w.cols);
  return y;
}

// dx(n, in) += dy(n, out) W, and dL/dW = dy^T x handed to the caller.
void linear_backward(ThreadPool& pool, const Buffer& dy, const Buffer& x, const HostMatrix& w, int64_t n, Buffer& dx,
                     const std::function<void(const float*)>& on_weight) {
  const Buffer wt = transpose(w.data.data(), w.rows, w.cols);
  Buffer part(size_t(n * w.cols));
  cpu::matmul(pool, dy.data(), wt.data(), nullptr, part.data(), n, w.cols, w.rows);
  for (size_t i = 0; i < part.size(); ++i) dx[i] += part[i];
  const Buffer dyt = transpose(dy.data(), n, w.rows), xt = transpose(x.data(), n, w.cols);
  Buffer dw(size_t(w.rows * w.cols));
  cpu::matmul(pool, dyt.data(), xt.data(), nullptr, dw.data(), w.rows, w.cols, n);
  on_weight(dw.data());
}

// dx += the gradient through out = x / rms(x) * g, given dout (rows of dim).
void rmsnorm_backward(const Buffer& x, const HostMatrix& g, const Buffer& dout, int64_t n, int64_t dim, float eps,
                      Buffer& dx) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x.data() + t * dim;
    const float* dr = dout.data() + t * dim;
    double ss = 0, dot = 0;
    for (int64_t i = 0; i < dim; ++i) {
      ss += double(xr[i]) * xr[i];
      dot += double(xr[i]) * g.data[size_t(i)] * dr[i];
    }
    const double r = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    const double c = r * r * r * dot / double(dim);
    for (int64_t i = 0; i < dim; ++i) dx[size_t(t * dim + i)] += float(r * g.data[size_t(i)] * dr[i] - c * xr[i]);
  }
}

Buffer rmsnorm(const Buffer& x, const HostMatrix& g, int64_t n, int64_t dim, float eps) {
  Buffer out(x.size());
  cpu::rmsnorm(x.data(), g.data.data(), out.data(), n, dim, eps);
  return out;
}

// Head h's (n, d) slice of a (n, heads, d) buffer, and its way back.
Buffer head_slice(const Buffer& x, int64_t n, int64_t heads, int64_t d, int64_t h) {
  Buffer s(size_t(n * d));
  for (int64_t t = 0; t < n; ++t)
    std::copy_n(x.data() + (t * heads + h) * d, d, s.data() + t * d);
  return s;
}
void add_head_slice(Buffer& x, const Buffer& s, int64_t n, int64_t heads, int64_t d, int64_t h) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < d; ++i) x[size_t((t * heads + h) * d + i)] += s[size_t(t * d + i)];
}

struct LayerTape {
  Buffer x, xn1, q, k, v, p, a, x2, xn2, gate, up, h;  // p: (heads, n, n) attention probabilities
};

// Causal attention of one window (all heads), keeping the probabilities.
void attention_forward(ThreadPool& pool, const ModelConfig& c, int64_t n, LayerTape& tp) {
  const int64_t d = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(float(d));
  tp.p.assign(size_t(c.n_heads * n * n), 0.0f);
  tp.a.assign(size_t(n * c.q_dim()), 0.0f);
  Buffer kh, vt;
  for (int64_t h = 0; h < c.n_heads; ++h) {
    if (h % group == 0) {  // a KV head's K and V^T, once for its group of query heads
      kh = head_slice(tp.k, n, c.n_kv_heads, d, h / group);
      vt = transpose(head_slice(tp.v, n, c.n_kv_heads, d, h / group).data(), n, d);
    }
    const Buffer qh = head_slice(tp.q, n, c.n_heads, d, h);
    float* p = tp.p.data() + h * n * n;
    cpu::matmul(pool, qh.data(), kh.data(), nullptr, p, n, n, d);
    for (int64_t i = 0; i < n; ++i) {
      float* row = p + i * n;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j] * scale);
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] * scale - mx));
      for (int64_t j = 0; j <= i; ++j) row[j] = float(row[j] / sum);
      std::fill(row + i + 1, row + n, 0.0f);
    }
    Buffer oh(size_t(n * d));
    cpu::matmul(pool, p, vt.data(), nullptr, oh.data(), n, d, n);
    add_head_slice(tp.a, oh, n, c.n_heads, d, h);
  }
}

// From da (n, q_dim): dq (n, heads, d), dk and dv (n, kv_heads, d), before the rotary embedding is undone.
void attention_backward(ThreadPool& pool, const ModelConfig& c, int64_t n, const LayerTape& tp, const Buffer& da,
                        Buffer& dq, Buffer& dk, Buffer& dv) {
  const int64_t d = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(float(d));
  dq.assign(size_t(n * c.q_dim()), 0.0f);
  dk.assign(size_t(n * c.kv_dim()), 0.0f);
  dv.assign(size_t(n * c.kv_dim()), 0.0f);
  Buffer dp(size_t(n * n)), tmp(size_t(n * d)), vh, kt;
  for (int64_t h = 0; h < c.n_heads; ++h) {
    const int64_t kvh = h / group;
    if (h % group == 0) {  // a KV head's V and K^T, once for its group of query heads
      vh = head_slice(tp.v, n, c.n_kv_heads, d, kvh);
      kt = transpose(head_slice(tp.k, n, c.n_kv_heads, d, kvh).data(), n, d);
    }
    const float* p = tp.p.data() + h * n * n;
    const Buffer doh = head_slice(da, n, c.n_heads, d, h);
    cpu::matmul(pool, doh.data(), vh.data(), nullptr, dp.data(), n, n, d);  // dP = dO V^T
    for (int64_t i = 0; i < n; ++i) {  // dS = P o (dP - rowsum(P o dP)), times the score scale
      const float* pr = p + i * n;
      float* r = dp.data() + i * n;
      double dot = 0;
      for (int64_t j = 0; j <= i; ++j) dot += double(pr[j]) * r[j];
      for (int64_t j = 0; j < n; ++j) r[j] = j <= i ? float(pr[j] * (r[j] - dot)) * scale : 0.0f;
    }
    cpu::matmul(pool, dp.data(), kt.data(), nullptr, tmp.data(), n, d, n);  // dQ = dS K
    add_head_slice(dq, tmp, n, c.n_heads, d, h);
    const Buffer dst = transpose(dp.data(), n, n);
    const Buffer qt = transpose(head_slice(tp.q, n, c.n_heads, d, h).data(), n, d);
    cpu::matmul(pool, dst.data(), qt.data(), nullptr, tmp.data(), n, d, n);  // dK = dS^T Q
    add_head_slice(dk, tmp, n, c.n_kv_heads, d, kvh);
    const Buffer pt = transpose(p, n, n), dot_t = transpose(doh.data(), n, d);
    cpu::matmul(pool, pt.data(), dot_t.data(), nullptr, tmp.data(), n, d, n);  // dV = P^T dO
    add_head_slice(dv, tmp, n, c.n_kv_heads, d, kvh);
  }
}

void forward(const ModelConfig& c, const ModelWeights& w, ThreadPool& pool, std::span<const int32_t> tokens,
             std::vector<LayerTape>* tapes, Buffer& x, Buffer& xf, Buffer& logits) {
  const int64_t n = int64_t(tokens.size()), hidden = c.hidden_size;
  std::vector<int32_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), 0);
  x.assign(size_t(n * hidden), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[size_t(t)];
    KILN_CHECK(id >= 0 && id < c.vocab_size, invalid_argument, "token {} outside the vocabulary of {}", id, c.vocab_size);
    std::copy_n(w.embed.row(id), hidden, x.data() + t * hidden);
  }
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    LayerTape tp;
    tp.x = x;
    tp.xn1 = rmsnorm(x, L.attn_norm, n, hidden, c.rms_eps);
    tp.q = linear(pool, tp.xn1, L.wq, &L.bq, n);
    tp.k = linear(pool, tp.xn1, L.wk, &L.bk, n);
    tp.v = linear(pool, tp.xn1, L.wv, &L.bv, n);
    cpu::rope(tp.q.data(), positions.data(), n, c.n_heads, c.head_dim, c.rope);
    cpu::rope(tp.k.data(), positions.data(), n, c.n_kv_heads, c.head_dim, c.rope);
    attention_forward(pool, c, n, tp);
    const Buffer y = linear(pool, tp.a, L.wo, nullptr, n);
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    tp.x2 = x;
    tp.xn2 = rmsnorm(x, L.ffn_norm, n, hidden, c.rms_eps);
    tp.gate = linear(pool, tp.xn2, L.w_gate, nullptr, n);
    tp.up = linear(pool, tp.xn2, L.w_up, nullptr, n);
    tp.h.resize(tp.gate.size());
    cpu::silu_mul(tp.gate.data(), tp.up.data(), tp.h.data(), int64_t(tp.h.size()));
    const Buffer z = linear(pool, tp.h, L.w_down, nullptr, n);
    for (size_t i = 0; i < x.size(); ++i) x[i] += z[i];
    if (tapes) tapes->push_back(std::move(tp));
  }
  xf = rmsnorm(x, w.final_norm, n, hidden, c.rms_eps);
  logits = linear(pool, xf, w.output(), nullptr, n);
}

}  // namespace

void model_logits(const ModelConfig& config, const ModelWeights& w, ThreadPool& pool,
                  std::span<const int32_t> tokens, std::vector<float>& logits) {
  Buffer x, xf;
  forward(config, w, pool, tokens, nullptr, x, xf, logits);
}

double model_gradient(const ModelConfig& c, const ModelWeights& w, ThreadPool& pool, std::span<const int32_t> tokens,
                      const LogitLoss& loss, const WeightGradient& on_gradient) {
  const int64_t n = int64_t(tokens.size()), hidden = c.hidden_size, vocab = c.vocab_size;
  std::vector<LayerTape> tapes;
  tapes.reserve(w.layers.size());
  Buffer x, xf, logits;
  forward(c, w, pool, tokens, &tapes, x, xf, logits);
  Buffer dlogits(logits.size());
  const double value = loss(logits.data(), dlogits.data(), n, vocab);
  logits = Buffer();

  // Head and final norm: dxf = dlogits * head, then through the norm.
  const HostMatrix& head = w.output();
  Buffer dxf(size_t(n * hidden));
  {
    const Buffer ht = transpose(head.data.data(), head.rows, head.cols);
    cpu::matmul(pool, dlogits.data(), ht.data(), nullptr, dxf.data(), n, hidden, vocab);
  }
  dlogits = Buffer();
  Buffer dx(size_t(n * hidden), 0.0f);
  rmsnorm_backward(x, w.final_norm, dxf, n, hidden, c.rms_eps, dx);

  std::vector<int32_t> negated(tokens.size());  // the rotary embedding undone: the rotation by -angle
  for (int64_t t = 0; t < n; ++t) negated[size_t(t)] = -int32_t(t);
  for (int64_t l = int64_t(w.layers.size()) - 1; l >= 0; --l) {
    const LayerWeights& L = w.layers[size_t(l)];
    LayerTape& tp = tapes[size_t(l)];
    auto report = [&](LayerMatrix m) { return [&, m](const float* g) { on_gradient(l, m, g); }; };
    // Feed-forward block: x3 = x2 + down(silu(gate(xn2)) * up(xn2)).
    Buffer dh(size_t(n * c.intermediate_size), 0.0f);
    linear_backward(pool, dx, tp.h, L.w_down, n, dh, report(LayerMatrix::down));
    Buffer dgate(dh.size()), dup(dh.size());
    for (size_t i = 0; i < dh.size(); ++i) {
      const float g = tp.gate[i], sig = 1.0f / (1.0f + std::exp(-g));
      dup[i] = dh[i] * g * sig;
      dgate[i] = dh[i] * tp.up[i] * sig * (1.0f + g * (1.0f - sig));
    }
    tp.h = tp.gate = tp.up = Buffer();
    Buffer dxn(size_t(n * hidden), 0.0f);
    linear_backward(pool, dgate, tp.xn2, L.w_gate, n, dxn, report(LayerMatrix::gate));
    linear_backward(pool, dup, tp.xn2, L.w_up, n, dxn, report(LayerMatrix::up));
    rmsnorm_backward(tp.x2, L.ffn_norm, dxn, n, hidden, c.rms_eps, dx);
    // Attention block: x2 = x + o(attention(rope(q(xn1)), rope(k(xn1)), v(xn1))).
    Buffer da(size_t(n * c.q_dim()), 0.0f);
    linear_backward(pool, dx, tp.a, L.wo, n, da, report(LayerMatrix::o));
    Buffer dq, dk, dv;
    attention_backward(pool, c, n, tp, da, dq, dk, dv);
    tp.p = Buffer();
    cpu::rope(dq.data(), negated.data(), n, c.n_heads, c.head_dim, c.rope);
    cpu::rope(dk.data(), negated.data(), n, c.n_kv_heads, c.head_dim, c.rope);
    std::fill(dxn.begin(), dxn.end(), 0.0f);
    linear_backward(pool, dq, tp.xn1, L.wq, n, dxn, report(LayerMatrix::q));
    linear_backward(pool, dk, tp.xn1, L.wk, n, dxn, report(LayerMatrix::k));
    linear_backward(pool, dv, tp.xn1, L.wv, n, dxn, report(LayerMatrix::v));
    rmsnorm_backward(tp.x, L.attn_norm, dxn, n, hidden, c.rms_eps, dx);
    tp = LayerTape();
  }
  return value;
}

}  // namespace kiln::quant
