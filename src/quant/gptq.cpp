#include "quant/gptq.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "backend/cpu/ops.h"
#include "quant/gptq_site.h"
#include "quant/int4_descent.h"
#include "quant/quantize.h"

namespace kiln::quant {
namespace {

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

std::vector<float> gptq_inverse_factor(const std::vector<double>& H, int64_t n, double first_damp) {
  // An input that is always zero (diag 0) gets diag 1: any weight works for it.
  auto diag = [&](int64_t i) { return H[size_t(i * n + i)] == 0.0 ? 1.0 : H[size_t(i * n + i)]; };
  double mean_diag = 0.0;
  for (int64_t i = 0; i < n; ++i) mean_diag += diag(i);
  mean_diag /= double(std::max<int64_t>(n, 1));
  for (double damp = first_damp; damp <= 100.0; damp *= 10.0) {
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
  KILN_CHECK(!opt.grids || int64_t(opt.grids->size()) == rows * (cols / group), internal,
             "GPTQ: {} fixed grids for {} rows of {} groups", opt.grids ? opt.grids->size() : 0, rows, cols / group);
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
        grids[size_t(g)] = opt.grids ? (*opt.grids)[size_t(r * groups + g)]
                                     : gptq_group_grid(row.data() + g * group, loss_weight.data() + g * group, group,
                                                       opt.mse_grid);
        m.scales[size_t(r * groups + g)] = grids[size_t(g)].scale;
        m.mins[size_t(r * groups + g)] = grids[size_t(g)].min;
      };
      // In another order than the natural one a group's columns are reached at scattered times, so
      // its grid is fixed up front from the row as given (GPTQ's static groups); in the natural
      // order, from the row as updated so far when the group's first column is reached. Grids given
      // in opt.grids (the refit rounds) are fixed up front in either order.
      const bool up_front = permuted || opt.grids;
      if (up_front)
        for (int64_t g = 0; g < groups; ++g) set_grid(g);
      for (int64_t i = 0; i < cols; ++i) {
        const int64_t c = permuted ? opt.order[size_t(i)] : i;
        if (!up_front && c % group == 0) set_grid(c / group);
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

void cholesky_solve(const std::vector<double>& l, double* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {  // l y = b
    double s = b[i];
    for (int64_t k = 0; k < i; ++k) s -= l[size_t(i * n + k)] * b[k];
    b[i] = s / l[size_t(i * n + i)];
  }
  for (int64_t i = n - 1; i >= 0; --i) {  // l^T x = y
    double s = b[i];
    for (int64_t k = i + 1; k < n; ++k) s -= l[size_t(k * n + i)] * b[k];
    b[i] = s / l[size_t(i * n + i)];
  }
}

std::vector<Int4Grid> int4_grids_of(const QuantizedMatrix& q) {
  std::vector<Int4Grid> g(q.scales.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = {q.scales[i], q.mins[i]};
  return g;
}

int64_t refit_int4_grids(const float* w, QuantizedMatrix& q, const std::vector<double>& H, ThreadPool& pool) {
  const int64_t n = q.cols, group = q.group_size, G = q.groups(), P = 2 * G;
  // The unknowns of a row: scale_g at index g, min_g at G + g; the dequantized row is
  // sum_g scale_g * (codes on g) + min_g * (ones on g). R[k][h] = sum over h's columns j of H[k][j]
  // (H times group h's indicator) and the min-min block of the normal matrix do not depend on the row.
  std::vector<double> R(static_cast<size_t>(n * G), 0.0);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < n; ++j) R[size_t(k * G + j / group)] += H[size_t(k * n + j)];
  std::vector<double> mm(static_cast<size_t>(G * G), 0.0);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t h = 0; h < G; ++h) mm[size_t((k / group) * G + h)] += R[size_t(k * G + h)];
  std::vector<int64_t> changed(static_cast<size_t>(q.rows), 0);
  // Rows in blocks of kRows per pass over H (H is n^2 doubles: 134 MB at n = 4096, so one pass a row
  // would be bound by memory bandwidth). The normal equations are summed as H's rows go by, each
  // accumulator in the order of k, so a row's sums do not depend on the block it is in.
  constexpr int64_t kRows = 8;
  pool.parallel_for(q.rows, [&](int64_t lo, int64_t hi) {
    std::vector<double> codes(static_cast<size_t>(kRows * n)), Ns(static_cast<size_t>(kRows * P * P));
    std::vector<double> bs(static_cast<size_t>(kRows * P)), wHws(static_cast<size_t>(kRows));
    std::vector<double> theta0(static_cast<size_t>(P)), N, b, a, x;
    for (int64_t r0 = lo; r0 < hi; r0 += kRows) {
      const int64_t nb = std::min(kRows, hi - r0);
      for (int64_t i = 0; i < nb; ++i)
        for (int64_t c = 0; c < n; c += 2) {
          const uint8_t byte = q.q[size_t(((r0 + i) * n + c) / 2)];
          codes[size_t(i * n + c)] = byte & 0x0f;
          codes[size_t(i * n + c + 1)] = byte >> 4;
        }
      std::fill(Ns.begin(), Ns.end(), 0.0);
      std::fill(bs.begin(), bs.end(), 0.0);
      std::fill(wHws.begin(), wHws.end(), 0.0);
      for (int64_t k = 0; k < n; ++k) {
        const double* hk = H.data() + k * n;
        const int64_t g = k / group;
        for (int64_t i = 0; i < nb; ++i) {
          const float* wr = w + (r0 + i) * n;
          const double* code = codes.data() + i * n;
          double* Ni = Ns.data() + i * P * P;
          double* bi = bs.data() + i * P;
          double s = 0;  // (H w)_k
          for (int64_t j = 0; j < n; ++j) s += hk[j] * wr[j];
          wHws[size_t(i)] += s * wr[k];
          const double ck = code[k];
          for (int64_t h = 0; h < G; ++h) {
            double t = 0;  // (H (codes on group h))_k
            for (int64_t j = h * group; j < (h + 1) * group; ++j) t += hk[j] * code[j];
            Ni[g * P + h] += ck * t;
            Ni[g * P + G + h] += ck * R[size_t(k * G + h)];
          }
          bi[g] += ck * s;
          bi[G + g] += s;
        }
      }
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t r = r0 + i;
        N.assign(Ns.begin() + i * P * P, Ns.begin() + (i + 1) * P * P);
        b.assign(bs.begin() + i * P, bs.begin() + (i + 1) * P);
        const double wHw = wHws[size_t(i)];
        for (int64_t g = 0; g < G; ++g)
          for (int64_t h = 0; h < G; ++h) {
            N[size_t((G + h) * P + g)] = N[size_t(g * P + G + h)];
            N[size_t((G + g) * P + G + h)] = mm[size_t(g * G + h)];
          }
        for (int64_t g = 0; g < G; ++g) {
          theta0[size_t(g)] = q.scales[size_t(r * G + g)];
          theta0[size_t(G + g)] = q.mins[size_t(r * G + g)];
        }
        // error(theta) = theta^T N theta - 2 b^T theta + w^T H w
        auto error = [&](const std::vector<double>& t) {
          double e = wHw;
          for (int64_t i = 0; i < P; ++i) {
            double s = 0;
            for (int64_t j = 0; j < P; ++j) s += N[size_t(i * P + j)] * t[size_t(j)];
            e += t[size_t(i)] * (s - 2 * b[size_t(i)]);
          }
          return e;
        };
        // A small ridge toward the current grids keeps a group whose codes are all equal (its scale
        // and min then act alike) where it was instead of making the system singular.
        const double ridge = 1e-7;
        a = N;
        x = b;
        for (int64_t i = 0; i < P; ++i) {
          const double d = std::max(N[size_t(i * P + i)], 1e-30);
          a[size_t(i * P + i)] += ridge * d;
          x[size_t(i)] += ridge * d * theta0[size_t(i)];
        }
        if (!cholesky_lower(a, P)) continue;
        cholesky_solve(a, x.data(), P);
        bool finite = true;
        // A scale must stay positive as stored (fp32): GPTQ's next round codes against the grid
        // (Int4Grid::code). The comparison is made on the values as stored.
        for (int64_t g = 0; g < G; ++g) {
          x[size_t(g)] = double(float(x[size_t(g)]));
          x[size_t(G + g)] = double(float(x[size_t(G + g)]));
          finite = finite && x[size_t(g)] > 0 && std::isfinite(x[size_t(g)]) && std::isfinite(x[size_t(G + g)]);
        }
        if (!finite || !(error(x) < error(theta0))) continue;
        for (int64_t g = 0; g < G; ++g) {
          q.scales[size_t(r * G + g)] = float(x[size_t(g)]);
          q.mins[size_t(r * G + g)] = float(x[size_t(G + g)]);
        }
        changed[size_t(r)] = 1;
      }
    }
  });
  int64_t total = 0;
  for (int64_t c : changed) total += c;
  return total;
}

double hessian_error(const float* w, const QuantizedMatrix& q, const std::vector<double>& H, ThreadPool& pool) {
  double total = 0.0;
  for (double e : hessian_row_errors(w, q, H, pool)) total += e;
  return total;
}

std::vector<double> hessian_row_errors(const float* w, const QuantizedMatrix& q, const std::vector<double>& H,
                                       ThreadPool& pool) {
  const int64_t rows = q.rows, cols = q.cols;
  KILN_CHECK(int64_t(H.size()) == cols * cols, internal, "a {}-column matrix against a Hessian of {} entries", cols,
             H.size());
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
  return per_row;
}

namespace {

// Row r of `from` (codes, scales, mins) into `to`; both int4 of one shape.
void copy_int4_row(const QuantizedMatrix& from, QuantizedMatrix& to, int64_t r) {
  const int64_t half = from.cols / 2, groups = from.groups();
  std::copy_n(from.q.begin() + r * half, half, to.q.begin() + r * half);
  std::copy_n(from.scales.begin() + r * groups, groups, to.scales.begin() + r * groups);
  std::copy_n(from.mins.begin() + r * groups, groups, to.mins.begin() + r * groups);
}

constexpr SiteMatrix kSiteMatrices[] = {{"q", &LayerWeights::wq},      {"k", &LayerWeights::wk},
                                        {"v", &LayerWeights::wv},      {"o", &LayerWeights::wo},
                                        {"gate", &LayerWeights::w_gate}, {"up", &LayerWeights::w_up},
                                        {"down", &LayerWeights::w_down}};
constexpr int kSiteFirst[] = {0, 3, 4, 6, 7};  // site s: kSiteMatrices[kSiteFirst[s] .. kSiteFirst[s + 1])

}  // namespace

std::span<const SiteMatrix> site_matrices(int site) {
  KILN_CHECK(site >= 0 && site < 4, internal, "no matrix input site {}", site);
  return std::span<const SiteMatrix>(kSiteMatrices).subspan(size_t(kSiteFirst[site]),
                                                             size_t(kSiteFirst[site + 1] - kSiteFirst[site]));
}

double mean_diagonal(const std::vector<double>& a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[size_t(i * n + i)] / double(n);
  return s;
}

void gptq_site(LayerWeights& layer_w, int64_t layer, int site, int64_t cols, const std::vector<double>& H,
               ThreadPool& pool, int64_t int4_group, const std::function<void(const GptqReport&)>& on_matrix,
               const GptqOptions& options, const std::vector<float>* input_map_t) {
  GptqOptions opt = options;
  opt.grids = nullptr;  // per matrix: set below for the refit rounds only
  opt.order.clear();
  if (opt.act_order) opt.order = gptq_act_order(H, cols);
  const std::vector<float> U =
      opt.order.empty() ? gptq_inverse_factor(H, cols, opt.damp)
                        : gptq_inverse_factor(permuted_hessian(H, opt.order), cols, opt.damp);
  // The refit's and descent's objective (GptqOptions::fit_damp).
  std::vector<double> damped;
  if (options.fit_damp > 0) {
    damped = H;
    const double d = options.fit_damp * mean_diagonal(H, cols);
    for (int64_t i = 0; i < cols; ++i) damped[size_t(i * cols + i)] += d;
  }
  const std::vector<double>& fit_h = damped.empty() ? H : damped;
  for (const auto& [name, member] : site_matrices(site)) {
    HostMatrix& m = layer_w.*member;
    KILN_CHECK(m.cols == cols, internal, "GPTQ: layer {} {} has {} columns, its inputs {}", layer, name, m.cols, cols);
    if (input_map_t) {  // W <- W M: y(m, n) = x(m, k) w(n, k)^T with x = W and w = M^T
      std::vector<float> mapped(m.data.size());
      cpu::matmul(pool, m.data.data(), input_map_t->data(), nullptr, mapped.data(), m.rows, cols, cols);
      m.data = std::move(mapped);
    }
    const int64_t group = int4_group_for(m.cols, int4_group);
    KILN_CHECK(group > 0, unsupported, "int4 needs rows whose length is a multiple of 32, not {}", m.cols);
    GptqReport rep;
    rep.layer = layer;
    rep.matrix = name;
    rep.error_rtn = hessian_error(m.data.data(), quantize_int4(m.data.data(), m.rows, m.cols, group), H, pool);
    QuantizedMatrix q = gptq_int4(m.data.data(), m.rows, m.cols, group, U, pool, opt);
    // Refit rounds; a GPTQ pass on refit grids can land a row above its previous round, so each row
    // keeps its best round (by its own output error).
    if (options.refit_rounds > 0) {
      refit_int4_grids(m.data.data(), q, fit_h, pool);
      std::vector<double> best = hessian_row_errors(m.data.data(), q, fit_h, pool);
      for (int round = 2; round <= options.refit_rounds; ++round) {
        const std::vector<Int4Grid> grids = int4_grids_of(q);
        GptqOptions again = opt;
        again.grids = &grids;
        QuantizedMatrix next = gptq_int4(m.data.data(), m.rows, m.cols, group, U, pool, again);
        refit_int4_grids(m.data.data(), next, fit_h, pool);
        const std::vector<double> err = hessian_row_errors(m.data.data(), next, fit_h, pool);
        for (int64_t r = 0; r < m.rows; ++r)
          if (err[size_t(r)] < best[size_t(r)]) {
            best[size_t(r)] = err[size_t(r)];
            copy_int4_row(next, q, r);
          }
      }
    }
    if (options.descent_rounds > 0) rep.error_before_descent = hessian_error(m.data.data(), q, H, pool);
    for (int round = 0; round < options.descent_rounds; ++round) {
      rep.descent_moves += int4_coordinate_descent(m.data.data(), q, fit_h, options.descent_sweeps, pool).moves;
      refit_int4_grids(m.data.data(), q, fit_h, pool);
    }
    rep.error = hessian_error(m.data.data(), q, H, pool);
    m.quant = std::move(q);
    dequantize(m.quant, m.data.data());
    if (on_matrix) on_matrix(rep);
  }
}

std::vector<double> hessian_of(const float* x, int64_t rows, int64_t cols, int64_t chunk, ThreadPool& pool) {
  std::vector<double> H(static_cast<size_t>(cols * cols), 0.0);
  std::vector<int64_t> picked;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    picked.resize(static_cast<size_t>(std::min(chunk, rows - r0)));
    for (size_t j = 0; j < picked.size(); ++j) picked[j] = r0 + int64_t(j);
    add_gram(H, x, picked, cols, pool);
  }
  return H;
}

std::vector<double> cross_product_of(const float* a, const float* b, int64_t rows, int64_t cols, int64_t chunk,
                                     ThreadPool& pool) {
  // y(m, n) = x(m, k) w(n, k)^T with x = A^T and w = B^T (cols x k each, a chunk's rows transposed).
  std::vector<double> out(static_cast<size_t>(cols * cols), 0.0);
  std::vector<float> y(out.size()), at, bt;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t k = std::min(chunk, rows - r0);
    at.resize(size_t(cols * k));
    bt.resize(size_t(cols * k));
    for (int64_t t = 0; t < k; ++t)
      for (int64_t i = 0; i < cols; ++i) {
        at[size_t(i * k + t)] = a[(r0 + t) * cols + i];
        bt[size_t(i * k + t)] = b[(r0 + t) * cols + i];
      }
    cpu::matmul(pool, at.data(), bt.data(), nullptr, y.data(), cols, cols, k);
    for (size_t i = 0; i < y.size(); ++i) out[i] += double(y[i]);
  }
  return out;
}

void apply_gptq(ModelWeights& w, const Calibration& cal, ThreadPool& pool, int64_t int4_group,
                const std::function<void(const GptqReport&)>& on_matrix, const GptqOptions& options) {
  KILN_CHECK(cal.layers.size() == w.layers.size(), internal, "GPTQ: a calibration of {} layers for a model of {}",
             cal.layers.size(), w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l)
    for (int site = 0; site < 4; ++site) {
      const SiteStats& stats = cal.layers[l][size_t(site)];
      KILN_CHECK(stats.n_samples > 0 || stats.hessian_rows > 0, invalid_argument,
                 "GPTQ: no calibration rows for layer {}", l);
      gptq_site(w.layers[l], int64_t(l), site, stats.cols, input_hessian(stats, pool), pool, int4_group, on_matrix,
                options);
    }
}

}  // namespace kiln::quant
