#include "quant/gain_fit.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "core/check.h"
#include "quant/calibration.h"
#include "quant/gptq_site.h"
#include "quant/quantize.h"

namespace kiln::quant {
namespace {

constexpr std::array<const char*, 4> kSiteNames = {"q/k/v", "o", "gate/up", "down"};

std::vector<const HostMatrix*> site_matrices(const LayerWeights& L, int site) {
  switch (site) {
    case 0: return {&L.wq, &L.wk, &L.wv};
    case 1: return {&L.wo};
    case 2: return {&L.w_gate, &L.w_up};
    default: return {&L.w_down};
  }
}

// a (rows x cols, row-major) as cols x rows: cpu::matmul's operand layout for a^T.
std::vector<float> transposed(const float* a, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i) t[size_t(i * rows + r)] = a[r * cols + i];
  return t;
}

// A^T B (cols x cols) for a and b of rows x cols each, one fp32 product per `chunk` rows summed in
// fp64 (hessian_of's rule).
std::vector<double> cross_of(const float* a, const float* b, int64_t rows, int64_t cols, int64_t chunk,
                             ThreadPool& pool) {
  std::vector<double> out(static_cast<size_t>(cols * cols), 0.0);
  std::vector<float> y(out.size());
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t k = std::min(chunk, rows - r0);
    const std::vector<float> at = transposed(a + r0 * cols, k, cols), bt = transposed(b + r0 * cols, k, cols);
    cpu::matmul(pool, at.data(), bt.data(), nullptr, y.data(), cols, cols, k);
    for (size_t i = 0; i < y.size(); ++i) out[i] += double(y[i]);
  }
  return out;
}

// sum over the site's matrices of P^T R (cols x cols), P and R the matrices' values taken from
// `p` and `r` (rows_M x cols each).
std::vector<double> products(const std::vector<const HostMatrix*>& p, const std::vector<const HostMatrix*>& r,
                             int64_t cols, ThreadPool& pool) {
  std::vector<double> out(static_cast<size_t>(cols * cols), 0.0);
  for (size_t m = 0; m < p.size(); ++m) {
    const std::vector<double> one = cross_of(p[m]->data.data(), r[m]->data.data(), p[m]->rows, cols, p[m]->rows, pool);
    for (size_t i = 0; i < out.size(); ++i) out[i] += one[i];
  }
  return out;
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
  KILN_CHECK(window > 0 && int64_t(tokens.size()) >= window, invalid_argument,
             "the calibration text has {} tokens; it needs at least one window of {}", tokens.size(), window);
  KILN_CHECK(ridge >= 0 && std::isfinite(ridge), invalid_argument, "the gain fit's ridge must be >= 0, got {}", ridge);
  for (const LayerWeights& L : w.layers)
    for (int site = 0; site < 4; ++site)
      for (const HostMatrix* m : site_matrices(L, site))
        KILN_CHECK(m->quant.format == QuantFormat::int4, invalid_argument,
                   "the gain fit runs on int4 matrices (after GPTQ), not {}", format_name(m->quant.format));
  const int64_t n_windows = int64_t(tokens.size()) / window;
  tokens = tokens.first(size_t(n_windows * window));

  // Every site's inputs in the unquantized model, [layer][site] (rows x cols).
  std::vector<std::array<std::vector<float>, 4>> fp_x(w.layers.size());
  {
    CpuBackend fp(config, std::move(reference), pool);
    fp.set_activation_observer([&](int64_t layer, LinearSite site, const float* x, int64_t rows, int64_t cols) {
      fp_x[size_t(layer)][size_t(site)].assign(x, x + rows * cols);
    });
    forward_windows(fp, tokens, window, n_windows);
    reference = std::move(fp.mutable_weights());
  }

  // Under grouped-query attention o's input channel i is v's channel kv_of(i).
  const int64_t hd = config.head_dim, heads_per_kv = config.n_heads / config.n_kv_heads;
  auto kv_of = [&](int64_t i) { return (i / hd) / heads_per_kv * hd + i % hd; };

  CpuBackend backend(config, std::move(w), pool);
  backend.set_activation_observer([&](int64_t layer, LinearSite s, float* x, int64_t rows, int64_t cols) {
    const int site = int(s);
    std::vector<float>& xf = fp_x[size_t(layer)][size_t(site)];
    KILN_CHECK(int64_t(xf.size()) == rows * cols, internal, "gain fit: layer {} site {} saw {} inputs, then {}", layer,
               site, xf.size(), rows * cols);
    LayerWeights& L = backend.mutable_weights().layers[size_t(layer)];
    const std::vector<const HostMatrix*> q_m = site_matrices(L, site);
    const std::vector<const HostMatrix*> w_m = site_matrices(reference.layers[size_t(layer)], site);

    // E(c) = c^T A c - 2 b^T c + e0 over the site's inputs (gain_fit.h).
    const std::vector<double> Hq = hessian_of(x, rows, cols, window, pool), H = hessian_of(xf.data(), rows, cols, window, pool);
    const std::vector<double> C = cross_of(x, xf.data(), rows, cols, window, pool);
    const std::vector<double> QQ = products(q_m, q_m, cols, pool), QW = products(q_m, w_m, cols, pool),
                              WW = products(w_m, w_m, cols, pool);
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
    report.site = kSiteNames[size_t(site)];
    report.error_before = report.error_after = error_at(std::vector<double>(size_t(n), 1.0));

    // (A + D) c = b + D 1, D = ridge * mean(diag A) I: the ridge pulls every gain toward 1.
    double mean_diag = 0;
    for (int64_t i = 0; i < n; ++i) mean_diag += A[size_t(i * n + i)] / double(n);
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
  try {
    forward_windows(backend, tokens, window, n_windows);
  } catch (...) {
    w = std::move(backend.mutable_weights());
    throw;
  }
  w = std::move(backend.mutable_weights());
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
