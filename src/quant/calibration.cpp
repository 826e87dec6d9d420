#include "quant/calibration.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "core/check.h"

namespace kiln::quant {
namespace {

// Rows r of x (rows x cols) with (first + r) % stride == 0, while taken + those picked < limit.
std::vector<int64_t> picked_rows(int64_t first, int64_t rows, int64_t stride, int64_t limit, int64_t taken) {
  std::vector<int64_t> picked;
  for (int64_t r = 0; r < rows && taken + int64_t(picked.size()) < limit; ++r)
    if ((first + r) % stride == 0) picked.push_back(r);
  return picked;
}

// s.hessian += X^T X for the picked rows of x (at most a window of them).
void add_to_hessian(SiteStats& s, const float* x, const std::vector<int64_t>& picked, ThreadPool& pool) {
  if (picked.empty()) return;
  if (s.hessian.empty()) s.hessian.assign(size_t(s.cols * s.cols), 0.0);
  add_gram(s.hessian, x, picked, s.cols, pool);
  s.hessian_rows += int64_t(picked.size());
}

}  // namespace

void add_gram(std::vector<double>& H, const float* x, std::span<const int64_t> rows, int64_t cols, ThreadPool& pool) {
  const int64_t n = cols, k = int64_t(rows.size());
  if (k == 0) return;
  std::vector<float> xt(size_t(n * k));  // X^T: cols x k
  for (int64_t j = 0; j < k; ++j) {
    const float* row = x + rows[size_t(j)] * n;
    for (int64_t i = 0; i < n; ++i) xt[size_t(i * k + j)] = row[i];
  }
  std::vector<float> h(size_t(n * n));
  cpu::matmul(pool, xt.data(), xt.data(), nullptr, h.data(), n, n, k);  // h = X^T (X^T)^T
  for (size_t i = 0; i < h.size(); ++i) H[i] += double(h[i]);
}

std::vector<float> SiteStats::mean_abs() const {
  std::vector<float> m(static_cast<size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) m[size_t(i)] = tokens ? float(abs_sum[size_t(i)] / double(tokens)) : 0.0f;
  return m;
}

void forward_windows(const ModelConfig& config, ModelWeights& w, ThreadPool& pool, std::span<const int32_t> tokens,
                     int64_t window, const WindowObserver& observer) {
  const int64_t n_windows = window > 0 ? int64_t(tokens.size()) / window : 0;
  KILN_CHECK(n_windows > 0, invalid_argument, "the calibration text has {} tokens; it needs at least one window of {}",
             tokens.size(), window);
  CpuBackend backend(config, std::move(w), pool);
  backend.set_activation_observer([&](int64_t layer, LinearSite site, float* x, int64_t rows, int64_t cols) {
    observer(backend.mutable_weights(), layer, site, x, rows, cols);
  });
  std::unique_ptr<KvPool> kv = backend.new_kv_pool(int32_t(n_windows), int32_t(window));
  std::vector<int32_t> table(static_cast<size_t>(n_windows));
  std::vector<BatchEntry> entries(static_cast<size_t>(n_windows));
  for (int64_t i = 0; i < n_windows; ++i) {
    table[size_t(i)] = int32_t(i);
    entries[size_t(i)].tokens = tokens.subspan(size_t(i * window), size_t(window));
    entries[size_t(i)].block_table = std::span<const int32_t>(table).subspan(size_t(i), 1);
  }
  std::vector<float> logits;
  try {
    backend.forward_batch(*kv, entries, logits);
  } catch (...) {
    w = std::move(backend.mutable_weights());
    throw;
  }
  w = std::move(backend.mutable_weights());
}

Calibration calibrate(const ModelConfig& config, const ModelWeights& weights, ThreadPool& pool,
                      std::span<const int32_t> tokens, int64_t window, int64_t max_samples,
                      int64_t hessian_rows) {
  KILN_CHECK(window > 0 && int64_t(tokens.size()) >= window, invalid_argument,
             "the calibration text has {} tokens; it needs at least one window of {}", tokens.size(), window);
  const int64_t n_windows = int64_t(tokens.size()) / window, n_tokens = n_windows * window;
  const int64_t stride = std::max<int64_t>(1, n_tokens / std::max<int64_t>(max_samples, 1));
  const int64_t hessian_stride = std::max<int64_t>(1, n_tokens / std::max<int64_t>(hessian_rows, 1));
  Calibration cal;
  cal.layers.resize(size_t(config.n_layers));
  cal.tokens = n_tokens;
  int64_t first_token = 0;  // global index of row 0 of the current forward
  CpuBackend backend(config, weights, pool);
  backend.set_activation_observer([&](int64_t layer, LinearSite site, const float* x, int64_t rows, int64_t cols) {
    SiteStats& s = cal.layers[size_t(layer)][size_t(site)];
    if (s.cols == 0) {
      s.cols = cols;
      s.abs_sum.assign(size_t(cols), 0.0);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * cols;
      for (int64_t i = 0; i < cols; ++i) s.abs_sum[size_t(i)] += std::fabs(row[i]);
      if ((first_token + r) % stride == 0 && s.n_samples < max_samples) {
        s.samples.insert(s.samples.end(), row, row + cols);
        ++s.n_samples;
      }
    }
    s.tokens += rows;
    if (hessian_rows > 0)
      add_to_hessian(s, x, picked_rows(first_token, rows, hessian_stride, hessian_rows, s.hessian_rows), pool);
  });
  std::vector<float> logits;
  for (int64_t w = 0; w < n_windows; ++w) {
    auto seq = backend.new_sequence(window);
    first_token = w * window;
    backend.forward(*seq, tokens.subspan(size_t(w * window), size_t(window)), false, logits);
  }
  return cal;
}

}  // namespace kiln::quant
