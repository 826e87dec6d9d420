#include "quant/rotation.h"

#include <cmath>
#include <numbers>

#include "backend/cpu/ops.h"
#include "core/check.h"

namespace kiln::quant {
namespace {

// splitmix64: the per-layer seeds, and the uniform draws behind the Gaussian ones. Its own generator
// and Box-Muller (not std::normal_distribution, whose algorithm each standard library picks) so that
// one seed gives the same rotation, and the same file, whatever library kiln is built with.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double uniform_open(uint64_t& state) {  // in (0, 1)
  return (double(splitmix64(state) >> 11) + 0.5) * 0x1.0p-53;
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

void make_dense(HostMatrix& m) { m.quant = QuantizedMatrix{}; }

// m(rows, n) = m R^T: every row r becomes R r.
void turn_rows(ThreadPool& pool, HostMatrix& m, const std::vector<float>& r) {
  const int64_t n = m.cols;
  KILN_CHECK(int64_t(r.size()) == n * n, internal, "rotation of {} for rows of {}", r.size(), n);
  std::vector<float> out(m.data.size());
  cpu::matmul(pool, m.data.data(), r.data(), nullptr, out.data(), m.rows, n, n);
  m.data = std::move(out);
  make_dense(m);
}

// m(n, cols) = R m: every column c becomes R c.
void turn_columns(ThreadPool& pool, HostMatrix& m, const std::vector<float>& r) {
  const int64_t n = m.rows, k = m.cols;
  KILN_CHECK(int64_t(r.size()) == n * n, internal, "rotation of {} for columns of {}", r.size(), n);
  std::vector<float> t(m.data.size());  // m^T (k, n)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) t[size_t(j * n + i)] = m.data[size_t(i * k + j)];
  cpu::matmul(pool, r.data(), t.data(), nullptr, m.data.data(), n, k, n);
  make_dense(m);
}

// m = m diag(g): g folded into the columns that read a norm's output.
void scale_columns(HostMatrix& m, const HostMatrix& g) {
  KILN_CHECK(g.data.size() == size_t(m.cols), internal, "norm of {} for a matrix of {} columns", g.data.size(), m.cols);
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) m.data[size_t(i * m.cols + j)] *= g.data[size_t(j)];
  make_dense(m);
}

void set_ones(HostMatrix& g) { std::fill(g.data.begin(), g.data.end(), 1.0f); }

// v(d) = P v, P (d, d) row-major.
void turn_segment(float* v, const std::vector<double>& p, int64_t d) {
  std::vector<double> s(v, v + d);
  for (int64_t a = 0; a < d; ++a) {
    double acc = 0;
    for (int64_t b = 0; b < d; ++b) acc += p[size_t(a * d + b)] * s[size_t(b)];
    v[a] = float(acc);
  }
}

// One layer's values turned by P: every kv head's rows of v (and its bias) to P W_v, and every query
// head's columns of o to W_o P^T (each row's segment s of that head to P s), so o's output is as it was.
void turn_values(const ModelConfig& c, LayerWeights& l, const std::vector<double>& p) {
  const int64_t d = c.head_dim, hidden = l.wv.cols;
  std::vector<float> column(static_cast<size_t>(d));
  for (int64_t head = 0; head < c.n_kv_heads; ++head)
    for (int64_t j = 0; j < hidden; ++j) {
      for (int64_t a = 0; a < d; ++a) column[size_t(a)] = l.wv.data[size_t((head * d + a) * hidden + j)];
      turn_segment(column.data(), p, d);
      for (int64_t a = 0; a < d; ++a) l.wv.data[size_t((head * d + a) * hidden + j)] = column[size_t(a)];
    }
  if (!l.bv.empty())
    for (int64_t head = 0; head < c.n_kv_heads; ++head) turn_segment(l.bv.data.data() + head * d, p, d);
  for (int64_t i = 0; i < l.wo.rows; ++i)
    for (int64_t head = 0; head < c.n_heads; ++head) turn_segment(l.wo.data.data() + i * l.wo.cols + head * d, p, d);
  make_dense(l.wv);
  make_dense(l.wo);
}

}  // namespace

std::vector<double> random_orthogonal(int64_t n, uint64_t seed) {
  KILN_CHECK(n >= 1, invalid_argument, "a rotation needs a size of at least 1, got {}", n);
  uint64_t state = seed;
  std::vector<double> q(size_t(n * n));
  for (size_t k = 0; k < q.size(); k += 2) {  // Box-Muller: two Gaussians from two uniforms
    const double radius = std::sqrt(-2.0 * std::log(uniform_open(state)));
    const double angle = 2.0 * std::numbers::pi * uniform_open(state);
    q[k] = radius * std::cos(angle);
    if (k + 1 < q.size()) q[k + 1] = radius * std::sin(angle);
  }
  // Gram-Schmidt on the rows, each row's projections removed twice ("twice is enough": the rows stay
  // orthonormal to double precision). Its triangular factor has a positive diagonal, which is what
  // makes Q uniform over the orthogonal group.
  for (int64_t i = 0; i < n; ++i) {
    double* qi = q.data() + i * n;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t j = 0; j < i; ++j) {
        const double* qj = q.data() + j * n;
        double dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += qi[k] * qj[k];
        for (int64_t k = 0; k < n; ++k) qi[k] -= dot * qj[k];
      }
    double norm = 0;
    for (int64_t k = 0; k < n; ++k) norm += qi[k] * qi[k];
    norm = std::sqrt(norm);
    for (int64_t k = 0; k < n; ++k) qi[k] /= norm;
  }
  return q;
}

void rotate_model(ModelConfig& config, ModelWeights& w, ThreadPool& pool, uint64_t seed) {
  KILN_CHECK(!w.embed.empty() && !w.final_norm.empty(), invalid_model, "rotating needs the embedding and final norm");
  uint64_t layer_seeds = seed ^ 0x6b696c6e726f74ull;  // "kilnrot": the kv-head rotations' own stream
  const std::vector<float> r = to_float(random_orthogonal(config.hidden_size, seed));

  // The head first, from the embedding as it was when they are tied.
  if (w.lm_head.empty()) w.lm_head = w.embed;
  scale_columns(w.lm_head, w.final_norm);
  set_ones(w.final_norm);
  turn_rows(pool, w.lm_head, r);
  config.tied_embeddings = false;
  turn_rows(pool, w.embed, r);

  for (LayerWeights& l : w.layers) {
    for (HostMatrix* m : {&l.wq, &l.wk, &l.wv}) {
      scale_columns(*m, l.attn_norm);
      turn_rows(pool, *m, r);
    }
    for (HostMatrix* m : {&l.w_gate, &l.w_up}) {
      scale_columns(*m, l.ffn_norm);
      turn_rows(pool, *m, r);
    }
    set_ones(l.attn_norm);
    set_ones(l.ffn_norm);
    turn_columns(pool, l.wo, r);
    turn_columns(pool, l.w_down, r);
    turn_values(config, l, random_orthogonal(config.head_dim, splitmix64(layer_seeds)));
  }
}

}  // namespace kiln::quant
