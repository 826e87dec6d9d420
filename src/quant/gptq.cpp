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

QuantizedMatrix gptq_int4(const float* w, int64_t rows, int64_t cols, int64_t group, const std::vector<float>& U,
                          ThreadPool& pool) {
  KILN_CHECK(group > 0 && group % 2 == 0 && cols % group == 0, invalid_argument,
             "int4 group size {} must be even and divide the row length {}", group, cols);
  QuantizedMatrix m = QuantizedMatrix::zeroed(QuantFormat::int4, rows, cols, group);
  const int64_t groups = cols / group;
  pool.parallel_for(rows, [&](int64_t lo, int64_t hi) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = lo; r < hi; ++r) {
      std::copy_n(w + r * cols, cols, row.begin());
      Int4Grid grid;
      for (int64_t i = 0; i < cols; ++i) {
        if (i % group == 0) {  // the group's grid from the row as updated so far
          grid = int4_grid(row.data() + i, group);
          m.scales[size_t(r * groups + i / group)] = grid.scale;
          m.mins[size_t(r * groups + i / group)] = grid.min;
        }
        const float q = grid.code(row[size_t(i)]);
        set_int4_code(m, r * cols + i, q);
        const float* ui = U.data() + i * cols;
        const float err = (row[size_t(i)] - grid.value(q)) / ui[i];
        for (int64_t j = i + 1; j < cols; ++j) row[size_t(j)] -= err * ui[j];
      }
    }
  });
  return m;
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
                const std::function<void(const GptqReport&)>& on_matrix) {
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
      KILN_CHECK(stats.n_samples > 0, invalid_argument, "GPTQ: no calibration rows for layer {}", l);
      const std::vector<double> H = input_hessian(stats, pool);
      const std::vector<float> U = gptq_inverse_factor(H, stats.cols);
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
        QuantizedMatrix q = gptq_int4(m.data.data(), m.rows, m.cols, group, U, pool);
        rep.error = hessian_error(m.data.data(), q, H, pool);
        m.quant = std::move(q);
        dequantize(m.quant, m.data.data());
        if (on_matrix) on_matrix(rep);
      }
    }
}

}  // namespace kiln::quant
