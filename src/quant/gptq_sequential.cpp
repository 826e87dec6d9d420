// GPTQ in the forward's order (gptq.h: apply_gptq_sequential), and its asymmetric form.
#include <array>

#include "core/check.h"
#include "quant/calibration.h"
#include "quant/gptq.h"
#include "quant/gptq_site.h"

namespace kiln::quant {
namespace {

// K^T (gptq_site's input_map_t) for K = (C + D) (H + D)^-1, C = X^T X~ (x: the unquantized model's inputs, xq: the quantized model's,
// rows x cols each), D = damp * mean(diag H) * I: W K minimizes |W X - W* X~|^2 + |W* - W|^2_D, the
// least-squares target of asymmetric calibration with a ridge toward W (not toward 0: where the
// inputs are unchanged, X~ = X, K is I and W* is W).
std::vector<float> asymmetric_map(const float* x, const float* xq, int64_t rows, int64_t cols, int64_t chunk,
                                  const std::vector<double>& H, double damp, ThreadPool& pool) {
  const int64_t n = cols;
  std::vector<double> c = cross_product_of(x, xq, rows, cols, chunk, pool);  // C[i][j] = sum_t x[t][i] xq[t][j]
  const double mean_diag = mean_diagonal(H, n);
  // A = H + D, factored once (A = L L^T); row i of K solves A k = c_i + d_i (A is symmetric).
  std::vector<double> l(H);
  for (int64_t i = 0; i < n; ++i) {
    const double d = damp * mean_diag + (H[size_t(i * n + i)] > 0 ? 0.0 : 1.0);
    l[size_t(i * n + i)] += d;
    c[size_t(i * n + i)] += d;
  }
  KILN_CHECK(cholesky_lower(l, n), internal, "asymmetric GPTQ: the damped Hessian is not positive definite");
  std::vector<float> k_t(size_t(n * n));
  pool.parallel_for(n, [&](int64_t lo, int64_t hi) {
    std::vector<double> b(static_cast<size_t>(n));
    for (int64_t r = lo; r < hi; ++r) {  // row r of K, written as column r of K^T
      for (int64_t i = 0; i < n; ++i) b[size_t(i)] = c[size_t(r * n + i)];
      cholesky_solve(l, b.data(), n);
      for (int64_t i = 0; i < n; ++i) k_t[size_t(i * n + r)] = float(b[size_t(i)]);
    }
  });
  return k_t;
}

}  // namespace

void apply_gptq_sequential(const ModelConfig& config, ModelWeights& w, ThreadPool& pool,
                           std::span<const int32_t> tokens, int64_t window, int64_t int4_group,
                           const std::function<void(const GptqReport&)>& on_matrix, const GptqOptions& options) {
  // Asymmetric: every site's inputs in the unquantized model first ([layer][site], rows x cols).
  std::vector<std::array<std::vector<float>, 4>> unquantized;
  if (options.asymmetric) {
    unquantized.resize(w.layers.size());
    forward_windows(config, w, pool, tokens, window,
                    [&](ModelWeights&, int64_t layer, LinearSite site, const float* x, int64_t rows, int64_t cols) {
                      unquantized[size_t(layer)][size_t(site)].assign(x, x + rows * cols);
                    });
  }
  // The observer sees each site's input for every window at once and quantizes the site's matrices
  // before the backend multiplies by them: everything after runs on the quantized model. A throw
  // leaves the caller its (partly quantized) weights.
  forward_windows(config, w, pool, tokens, window,
                  [&](ModelWeights& q, int64_t layer, LinearSite site, const float* x, int64_t rows, int64_t cols) {
    const std::vector<double> H = hessian_of(x, rows, cols, window, pool);
    std::vector<float> map_t;
    if (options.asymmetric) {
      std::vector<float>& fp_x = unquantized[size_t(layer)][size_t(site)];
      KILN_CHECK(int64_t(fp_x.size()) == rows * cols, internal, "asymmetric GPTQ: layer {} site {} saw {} inputs, then {}",
                 layer, int(site), fp_x.size(), rows * cols);
      map_t = asymmetric_map(fp_x.data(), x, rows, cols, window, H, options.damp, pool);
      std::vector<float>().swap(fp_x);  // done with this site
    }
    gptq_site(q.layers[size_t(layer)], layer, int(site), cols, H, pool, int4_group, on_matrix, options,
              options.asymmetric ? &map_t : nullptr);
  });
}

double sequential_gptq_bytes(const ModelConfig& c, int64_t rows, bool asymmetric) {
  // run()'s activations (x, xn, proj: hidden; q, attn: q_dim; k, v: kv_dim; gate, up: intermediate),
  // the K/V of every layer, one site's fp32 X^T and H products, and GPTQ's ~7 n^2 doubles.
  const double per_row = 4.0 * double(3 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.intermediate_size +
                                       2 * c.n_layers * c.kv_dim() + c.intermediate_size);
  // Asymmetric: every site's unquantized inputs (hidden twice, q_dim, intermediate a layer).
  const double kept =
      asymmetric ? 4.0 * double(c.n_layers * (2 * c.hidden_size + c.q_dim() + c.intermediate_size)) : 0.0;
  return double(rows) * (per_row + kept) + 8.0 * 8.0 * double(c.intermediate_size) * double(c.intermediate_size);
}

}  // namespace kiln::quant
