#include "quant/gain_fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "core/check.h"
#include "quant/calibration.h"
#include "quant/gptq_site.h"
#include "quant/quantize.h"

namespace kiln::quant {
namespace {

// sum over the site's matrices of P^T R (cols x cols), P from layer p and R from layer r.
std::vector<double> products(const LayerWeights& p, const LayerWeights& r, int site, int64_t cols, ThreadPool& pool) {
  std::vector<double> out(static_cast<size_t>(cols * cols), 0.0);
  for (const SiteMatrix& m : site_matrices(site)) {
    const HostMatrix &a = p.*m.member, &b = r.*m.member;
    const std::vector<double> one = cross_product_of(a.data.data(), b.data.data(), a.rows, cols, a.rows, pool);
    for (size_t i = 0; i < out.size(); ++i) out[i] += one[i];
  }
  return out;
}

// "q/k/v", "o", "gate/up", "down".
std::string site_name(int site) {
  std::string name;
  for (const SiteMatrix& m : site_matrices(site)) {
    if (!name.empty()) name += '/';
    name += m.name;
  }
  return name;
}

double frobenius_dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Row r of an int4 matrix times c: its groups' scales and mins, and its dequantized values
// recomputed from the codes (the values the kernels compute).
void scale_int4_row(HostMatrix& m, int64_t r, float c) {
  QuantizedMatrix& q = m.quant;
  for (int64_t g = 0; g < q.groups(); ++g) {
    q.scales[size_t(r * q.groups() + g)] *= c;
    q.mins[size_t(r * q.groups() + g)] *= c;
  }
  dequantize_row(q, r, m.data.data() + r * m.cols);
}

}  // namespace

void fit_channel_gains(const ModelConfig& config, ModelWeights reference, ModelWeights& w, ThreadPool& pool,
                       std::span<const int32_t> tokens, int64_t window, double ridge,
                       const std::function<void(const GainFitReport&)>& on_site) {
  KILN_CHECK(ridge >= 0 && std::isfinite(ridge), invalid_argument, "the gain fit's ridge must be >= 0, got {}", ridge);
  for (const LayerWeights& L : w.layers)
    for (int site = 0; site < 4; ++site)
      for (const SiteMatrix& m : site_matrices(site))
        KILN_CHECK((L.*m.member).quant.format == QuantFormat::int4, invalid_argument,
                   "the gain fit runs on int4 matrices (after GPTQ), not {}", format_name((L.*m.member).quant.format));

  // Every site's inputs in the unquantized model, [layer][site] (rows x cols).
  std::vector<std::array<std::vector<float>, 4>> fp_x(w.layers.size());
  forward_windows(config, reference, pool, tokens, window,
                  [&](ModelWeights&, int64_t layer, LinearSite site, const float* x, int64_t rows, int64_t cols) {
                    fp_x[size_t(layer)][size_t(site)].assign(x, x + rows * cols);
                  });

  // Under grouped-query attention o's input channel i is v's channel kv_of(i).
  const int64_t hd = config.head_dim, heads_per_kv = config.n_heads / config.n_kv_heads;
  auto kv_of = [&](int64_t i) { return (i / hd) / heads_per_kv * hd + i % hd; };

  forward_windows(config, w, pool, tokens, window,
                  [&](ModelWeights& q, int64_t layer, LinearSite s, float* x, int64_t rows, int64_t cols) {
    const int site = int(s);
    std::vector<float>& xf = fp_x[size_t(layer)][size_t(site)];
    KILN_CHECK(int64_t(xf.size()) == rows * cols, internal, "gain fit: layer {} site {} saw {} inputs, then {}", layer,
               site, xf.size(), rows * cols);
    LayerWeights& L = q.layers[size_t(layer)];
    const LayerWeights& R = reference.layers[size_t(layer)];

    // E(c) = c^T A c - 2 b^T c + e0 over the site's inputs (gain_fit.h).
    const std::vector<double> Hq = hessian_of(x, rows, cols, window, pool), H = hessian_of(xf.data(), rows, cols, window, pool);
    const std::vector<double> C = cross_product_of(x, xf.data(), rows, cols, window, pool);
    const std::vector<double> QQ = products(L, L, site, cols, pool), QW = products(L, R, site, cols, pool),
                              WW = products(R, R, site, cols, pool);
    std::vector<float>().swap(xf);  // done with this site's unquantized inputs
    // Parameters: one gain a channel, but o's channels that read one v channel share theirs.
    const int64_t n = site == 1 ? config.kv_dim() : cols;
    auto param = [&](int64_t i) { return site == 1 ? kv_of(i) : i; };
    std::vector<double> A(static_cast<size_t>(n * n), 0.0), b(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const size_t ij = size_t(i * cols + j);
        A[size_t(param(i) * n + param(j))] += QQ[ij] * Hq[ij];
        b[size_t(param(i))] += QW[ij] * C[ij];
      }
    const double e0 = frobenius_dot(WW, H);
    auto error_at = [&](const std::vector<double>& c) {
      double quad = 0, lin = 0;
      for (int64_t i = 0; i < n; ++i) {
        double row = 0;
        for (int64_t j = 0; j < n; ++j) row += A[size_t(i * n + j)] * c[size_t(j)];
        quad += c[size_t(i)] * row;
        lin += b[size_t(i)] * c[size_t(i)];
      }
      return quad - 2 * lin + e0;
    };
    GainFitReport report;
    report.layer = layer;
    report.site = site_name(site);
    report.error_before = report.error_after = error_at(std::vector<double>(size_t(n), 1.0));

    // (A + D) c = b + D 1, D = ridge * mean(diag A) I: the ridge pulls every gain toward 1.
    const double mean_diag = mean_diagonal(A, n);
    std::vector<double> l(A), c(b);
    for (int64_t i = 0; i < n; ++i) {
      const double d = ridge * mean_diag + (A[size_t(i * n + i)] > 0 ? 0.0 : 1.0);  // a dead channel keeps 1
      l[size_t(i * n + i)] += d;
      c[size_t(i)] += d;
    }
    bool ok = cholesky_lower(l, n);
    if (ok) cholesky_solve(l, c.data(), n);
    for (double g : c) ok = ok && std::isfinite(g) && g > 0;
    const double after = ok ? error_at(c) : report.error_before;
    // Kept only for a gain above the sums' rounding (where the models already agree, E is ~1e-15 of
    // the outputs' energy and its changes are noise).
    if (ok && report.error_before - after > 1e-9 * e0) {
      report.kept = true;
      report.error_after = after;
      report.min_gain = float(*std::min_element(c.begin(), c.end()));
      report.max_gain = float(*std::max_element(c.begin(), c.end()));
      // The gains go where they are exact (gain_fit.h), and onto x, which the forward goes on with.
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < cols; ++i) x[r * cols + i] *= float(c[size_t(param(i))]);
      switch (site) {
        case 0:
        case 2: {
          HostMatrix& norm = site == 0 ? L.attn_norm : L.ffn_norm;
          for (int64_t i = 0; i < cols; ++i) norm.data[size_t(i)] *= float(c[size_t(i)]);
          break;
        }
        case 1:
          for (int64_t p = 0; p < n; ++p) {
            scale_int4_row(L.wv, p, float(c[size_t(p)]));
            if (!L.bv.empty()) L.bv.data[size_t(p)] *= float(c[size_t(p)]);
          }
          break;
        default:
          for (int64_t p = 0; p < n; ++p) scale_int4_row(L.w_up, p, float(c[size_t(p)]));
      }
    }
    if (on_site) on_site(report);
  });
}

double gain_fit_bytes(const ModelConfig& c, int64_t rows) {
  // Kept: every site's unquantized inputs (hidden twice, q_dim, intermediate a layer). One forward's
  // activations as sequential_gptq_bytes counts them, and one site's products (~8 n^2 doubles).
  const double kept = 4.0 * double(c.n_layers * (2 * c.hidden_size + c.q_dim() + c.intermediate_size));
  const double per_row = 4.0 * double(3 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.intermediate_size +
                                       2 * c.n_layers * c.kv_dim() + c.intermediate_size);
  return double(rows) * (kept + per_row) + 8.0 * 8.0 * double(c.intermediate_size) * double(c.intermediate_size);
}

}  // namespace kiln::quant
