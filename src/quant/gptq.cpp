#include "quant/gptq.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "quant/quantize.h"

namespace kiln::quant {
namespace {

// In-place lower Cholesky factor of the n x n row-major a (upper triangle left as is); false if a
// is not positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double* aj = a.data() + j * n;
    double d = aj[j];
    for (int64_t k = 0; k < j; ++k) d -= aj[k] * aj[k];
    if (!(d > 0.0) || !std::isfinite(d)) return false;
    aj[j] = std::sqrt(d);
    const double inv = 1.0 / aj[j];
    for (int64_t i = j + 1; i < n; ++i) {
      double* ai = a.data() + i * n;
      double s = ai[j];
      for (int64_t k = 0; k < j; ++k) s -= ai[k] * aj[k];
      ai[j] = s * inv;
    }
  }
  return true;
}

// The lower-triangular inverse of the lower factor l (n x n row-major): x = l^-1, row by row
// (x_i = (e_i - sum_{k < i} l_ik x_k) / l_ii), so every inner loop runs along a row.
std::vector<double> lower_inverse(const std::vector<double>& l, int64_t n) {
  std::vector<double> x(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double* xi = x.data() + i * n;
    xi[i] = 1.0;
    for (int64_t k = 0; k < i; ++k) {
      const double lik = l[size_t(i * n + k)];
      const double* xk = x.data() + k * n;
      for (int64_t c = 0; c <= k; ++c) xi[c] -= lik * xk[c];
    }
    const double inv = 1.0 / l[size_t(i * n + i)];
    for (int64_t c = 0; c <= i; ++c) xi[c] *= inv;
  }
  return x;
}

}  // namespace

std::vector<double> input_hessian(const SiteStats& site, ThreadPool& pool) {
  if (site.hessian_rows > 0) return site.hessian;  // summed during calibration
  const int64_t n = site.cols, rows = site.n_samples;
  std::vector<double> H(size_t(n * n), 0.0);
  pool.parallel_for(n, [&](int64_t lo, int64_t hi) {  // the upper triangle, row a from column a
    for (int64_t a = lo; a < hi; ++a) {
      double* ha = H.data() + a * n;
      for (int64_t r = 0; r < rows; ++r) {
        const float* x = site.samples.data() + r * n;
        const double xa = x[a];
        if (xa == 0.0) continue;
        for (int64_t b = a; b < n; ++b) ha[b] += xa * x[b];
      }
    }
  });
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < a; ++b) H[size_t(a * n + b)] = H[size_t(b * n + a)];
  return H;
}

std::vector<float> gptq_inverse_factor(const std::vector<double>& H, int64_t n) {
  // An input that is always zero (diag 0) gets diag 1: any weight works for it.
  auto diag = [&](int64_t i) { return H[size_t(i * n + i)] == 0.0 ? 1.0 : H[size_t(i * n + i)]; };
  double mean_diag = 0.0;
  for (int64_t i = 0; i < n; ++i) mean_diag += diag(i);
  mean_diag /= double(std::max<int64_t>(n, 1));
  for (double damp = 0.01; damp <= 100.0; damp *= 10.0) {
    std::vector<double> a = H;
    for (int64_t i = 0; i < n; ++i) a[size_t(i * n + i)] = diag(i) + damp * mean_diag;
    if (!cholesky_lower(a, n)) continue;
    // (H + damp I)^-1 = l^-T l^-1; its upper factor U (inverse = U^T U) is the transpose of the lower
    // factor of the inverse.
    const std::vector<double> li = lower_inverse(a, n);
    std::vector<double> lt(size_t(n * n), 0.0);  // li transposed: row i = column i of li (zero before i)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = 0; i <= k; ++i) lt[size_t(i * n + k)] = li[size_t(k * n + i)];
    std::vector<double> inv(size_t(n * n), 0.0);  // li^T li: entry (i, j) = sum_k li_ki li_kj, k >= max(i, j)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const double* ri = lt.data() + i * n;
        const double* rj = lt.data() + j * n;
        double s = 0.0;
        for (int64_t k = i; k < n; ++k) s += ri[k] * rj[k];
        inv[size_t(i * n + j)] = inv[size_t(j * n + i)] = s;
      }
    if (!cholesky_lower(inv, n)) continue;
    std::vector<float> U(size_t(n * n), 0.0f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j) U[size_t(j * n + i)] = float(inv[size_t(i * n + j)]);
    return U;
  }
  KILN_FAIL(internal, "GPTQ: the calibration Hessian ({} x {}) is not positive definite even with damping", n, n);
}

Int4Grid gptq_group_grid(const float* v, const float* loss_weight, int64_t n, bool mse) {
  const Int4Grid full = int4_grid(v, n);
  if (!mse) return full;
  // The range shrunk by p (each end toward zero), for the p in 1, 0.97, .., 0.73 with the least
  // sum of loss_weight * (v - Q(v))^2: GPTQ's loss for a column quantized with error e is
  // e^2 / [H^-1]_ii, so loss_weight = 1 / U_ii^2.
  const float lo = full.min, hi = full.min + 15.0f * full.scale;
  Int4Grid best = full;
  double best_err = INFINITY;
  for (int step = 0; step <= 9; ++step) {
    const float p = 1.0f - 0.03f * float(step);
    const float l = lo < 0 ? lo * p : lo, h = hi > 0 ? hi * p : hi;
    const Int4Grid g{std::max(h - l, 1e-5f) / 15.0f, l};
    double err = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double d = double(v[k]) - g.value(g.code(v[k]));
      err += double(loss_weight[k]) * d * d;
    }
    if (err < best_err) best_err = err, best = g;
  }
  return best;
}

QuantizedMatrix gptq_int4(const float* w, int64_t rows, int64_t cols, int64_t group, const std::vector<float>& U,
                          ThreadPool& pool, const GptqOptions& opt) {
  KILN_CHECK(group > 0 && group % 2 == 0 && cols % group == 0, invalid_argument,
             "int4 group size {} must be even and divide the row length {}", group, cols);
  KILN_CHECK(opt.order.empty() || int64_t(opt.order.size()) == cols, internal, "GPTQ: an order of {} columns for {}",
             opt.order.size(), cols);
  QuantizedMatrix m = QuantizedMatrix::zeroed(QuantFormat::int4, rows, cols, group);
  const int64_t groups = cols / group;
  const bool permuted = !opt.order.empty();
  // Column c is quantized at position pos[c] of the order; its loss weight is 1 / U[pos][pos]^2.
  std::vector<int64_t> pos(static_cast<size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) pos[size_t(permuted ? opt.order[size_t(i)] : i)] = i;
  std::vector<float> loss_weight(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    const float u = U[size_t(pos[size_t(c)] * cols + pos[size_t(c)])];
    loss_weight[size_t(c)] = 1.0f / (u * u);
  }
  pool.parallel_for(rows, [&](int64_t lo, int64_t hi) {
    std::vector<float> row(static_cast<size_t>(cols));
    std::vector<Int4Grid> grids(static_cast<size_t>(groups));
    for (int64_t r = lo; r < hi; ++r) {
      std::copy_n(w + r * cols, cols, row.begin());
      auto set_grid = [&](int64_t g) {
        grids[size_t(g)] = gptq_group_grid(row.data() + g * group, loss_weight.data() + g * group, group, opt.mse_grid);
        m.scales[size_t(r * groups + g)] = grids[size_t(g)].scale;
        m.mins[size_t(r * groups + g)] = grids[size_t(g)].min;
      };
      // In another order than the natural one a group's columns are reached at scattered times, so
      // its grid is fixed up front from the row as given (GPTQ's static groups); in the natural
      // order, from the row as updated so far when the group's first column is reached.
      if (permuted)
        for (int64_t g = 0; g < groups; ++g) set_grid(g);
      for (int64_t i = 0; i < cols; ++i) {
        const int64_t c = permuted ? opt.order[size_t(i)] : i;
        if (!permuted && c % group == 0) set_grid(c / group);
        const Int4Grid& grid = grids[size_t(c / group)];
        const float q = grid.code(row[size_t(c)]);
        set_int4_code(m, r * cols + c, q);
        const float* ui = U.data() + i * cols;
        const float err = (row[size_t(c)] - grid.value(q)) / ui[i];
        if (permuted)
          for (int64_t j = i + 1; j < cols; ++j) row[size_t(opt.order[size_t(j)])] -= err * ui[j];
        else
          for (int64_t j = i + 1; j < cols; ++j) row[size_t(j)] -= err * ui[j];
      }
    }
  });
  return m;
}

std::vector<int64_t> gptq_act_order(const std::vector<double>& H, int64_t cols) {
  std::vector<int64_t> order(static_cast<size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return H[size_t(a * cols + a)] > H[size_t(b * cols + b)];
  });
  return order;
}

std::vector<double> permuted_hessian(const std::vector<double>& H, const std::vector<int64_t>& order) {
  const int64_t n = int64_t(order.size());
  std::vector<double> P(size_t(n * n));
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) P[size_t(a * n + b)] = H[size_t(order[size_t(a)] * n + order[size_t(b)])];
  return P;
}

double hessian_error(const float* w, const QuantizedMatrix& q, const std::vector<double>& H, ThreadPool& pool) {
  const int64_t rows = q.rows, cols = q.cols;
  std::vector<double> per_row(static_cast<size_t>(rows));
  pool.parallel_for(rows, [&](int64_t lo, int64_t hi) {
    std::vector<float> dq(static_cast<size_t>(cols));
    std::vector<double> d(static_cast<size_t>(cols));
    for (int64_t r = lo; r < hi; ++r) {
      dequantize_row(q, r, dq.data());
      for (int64_t c = 0; c < cols; ++c) d[size_t(c)] = double(w[r * cols + c]) - dq[size_t(c)];
      double e = 0.0;
      for (int64_t a = 0; a < cols; ++a) {
        if (d[size_t(a)] == 0.0) continue;
        double s = 0.0;
        const double* ha = H.data() + a * cols;
        for (int64_t b = 0; b < cols; ++b) s += ha[b] * d[size_t(b)];
        e += d[size_t(a)] * s;
      }
      per_row[size_t(r)] = e;
    }
  });
  double total = 0.0;
  for (double e : per_row) total += e;
  return total;
}

void apply_gptq(ModelWeights& w, const Calibration& cal, ThreadPool& pool, int64_t int4_group,
                const std::function<void(const GptqReport&)>& on_matrix, const GptqOptions& options) {
  KILN_CHECK(cal.layers.size() == w.layers.size(), internal, "GPTQ: a calibration of {} layers for a model of {}",
             cal.layers.size(), w.layers.size());
  struct Site {
    int index;  // LinearSite: attn_in, attn_out, mlp_in, mlp_act
    std::vector<std::pair<const char*, HostMatrix LayerWeights::*>> matrices;
  };
  const Site sites[] = {{0, {{"q", &LayerWeights::wq}, {"k", &LayerWeights::wk}, {"v", &LayerWeights::wv}}},
                        {1, {{"o", &LayerWeights::wo}}},
                        {2, {{"gate", &LayerWeights::w_gate}, {"up", &LayerWeights::w_up}}},
                        {3, {{"down", &LayerWeights::w_down}}}};
  for (size_t l = 0; l < w.layers.size(); ++l)
    for (const Site& site : sites) {
      const SiteStats& stats = cal.layers[l][size_t(site.index)];
      KILN_CHECK(stats.n_samples > 0 || stats.hessian_rows > 0, invalid_argument,
                 "GPTQ: no calibration rows for layer {}", l);
      const std::vector<double> H = input_hessian(stats, pool);
      GptqOptions opt = options;
      if (opt.act_order) opt.order = gptq_act_order(H, stats.cols);
      const std::vector<float> U =
          opt.order.empty() ? gptq_inverse_factor(H, stats.cols) : gptq_inverse_factor(permuted_hessian(H, opt.order), stats.cols);
      for (const auto& [name, member] : site.matrices) {
        HostMatrix& m = w.layers[l].*member;
        KILN_CHECK(m.cols == stats.cols, internal, "GPTQ: layer {} {} has {} columns, its inputs {}", l, name, m.cols,
                   stats.cols);
        const int64_t group = int4_group_for(m.cols, int4_group);
        KILN_CHECK(group > 0, unsupported, "int4 needs rows whose length is a multiple of 32, not {}", m.cols);
        GptqReport rep;
        rep.layer = int64_t(l);
        rep.matrix = name;
        rep.error_rtn = hessian_error(m.data.data(), quantize_int4(m.data.data(), m.rows, m.cols, group), H, pool);
        QuantizedMatrix q = gptq_int4(m.data.data(), m.rows, m.cols, group, U, pool, opt);
        rep.error = hessian_error(m.data.data(), q, H, pool);
        m.quant = std::move(q);
        dequantize(m.quant, m.data.data());
        if (on_matrix) on_matrix(rep);
      }
    }
}

}  // namespace kiln::quant
