#include "quant/grid_tuning.h"

#include <array>
#include <chrono>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/check.h"
#include "quant/kl_divergence.h"
#include "quant/model_gradient.h"
#include "quant/quantize.h"

namespace kiln::quant {
namespace {

// One int4 matrix's tuned grid: s = s0 exp(a), m = m0 + s0 b per group, or with one gain a row
// (per_row) s = s0 exp(a_r), m = m0 exp(a_r); with Adam's moments and this step's gradients.
struct Grid {
  HostMatrix* matrix;
  bool per_row = false;
  std::vector<float> s0, m0, a, b, ga, gb, ma, va, mb, vb;

  Grid(HostMatrix& m, bool rows) : matrix(&m), per_row(rows), s0(m.quant.scales), m0(m.quant.mins) {
    const size_t n = per_row ? size_t(m.rows) : s0.size();
    for (auto* v : {&a, &ga, &ma, &va}) v->assign(n, 0.0f);
    if (!per_row)
      for (auto* v : {&b, &gb, &mb, &vb}) v->assign(n, 0.0f);  // the mins' offsets: per group only
  }

  // dL/da, dL/db from dL/dW: dW/ds = code, dW/dm = 1 summed over each group; a row's gain scales
  // every weight of the row, so dL/da_r = sum_c dW_rc W_rc.
  void gradient(const float* dw) {
    const QuantizedMatrix& q = matrix->quant;
    const int64_t groups = q.groups(), gs = q.group_size;
    for (int64_t r = 0; r < q.rows; ++r) {
      if (per_row) {
        double d = 0;
        for (int64_t k = 0; k < q.cols; ++k) d += double(dw[r * q.cols + k]) * matrix->data[size_t(r * q.cols + k)];
        ga[size_t(r)] = float(d);
        continue;
      }
      for (int64_t g = 0; g < groups; ++g) {
        double ds = 0, dm = 0;
        for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
          const int64_t at = r * q.cols + k;
          ds += double(dw[at]) * int4_code(q, at);
          dm += dw[at];
        }
        const size_t i = size_t(r * groups + g);
        ga[i] = float(ds * q.scales[i]);
        gb[i] = float(dm * s0[i]);
      }
    }
  }

  void adam_step(double lr, int64_t t) {
    constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-12;
    const double c1 = 1.0 - std::pow(b1, double(t)), c2 = 1.0 - std::pow(b2, double(t));
    auto step = [&](std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m, std::vector<float>& v) {
      for (size_t i = 0; i < p.size(); ++i) {
        m[i] = float(b1 * m[i] + (1 - b1) * g[i]);
        v[i] = float(b2 * v[i] + (1 - b2) * double(g[i]) * g[i]);
        p[i] -= float(lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps));
      }
    };
    step(a, ga, ma, va);
    QuantizedMatrix& q = matrix->quant;
    if (per_row) {
      for (size_t i = 0; i < s0.size(); ++i) {
        const float gain = std::exp(a[i / size_t(q.groups())]);
        q.scales[i] = s0[i] * gain;
        q.mins[i] = m0[i] * gain;
      }
    } else {
      step(b, gb, mb, vb);
      for (size_t i = 0; i < s0.size(); ++i) {
        q.scales[i] = s0[i] * std::exp(a[i]);
        q.mins[i] = m0[i] + s0[i] * b[i];
      }
    }
    dequantize(q, matrix->data.data());
  }
};

// In place: logits -> log-softmax, per row of `vocab` (kl_divergence.h's, row by row).
void log_softmax_rows(float* x, int64_t rows, int64_t vocab) {
  std::vector<double> row;
  for (int64_t t = 0; t < rows; ++t) {
    log_softmax(std::span<const float>(x + t * vocab, size_t(vocab)), row);
    std::copy(row.begin(), row.end(), x + t * vocab);
  }
}

}  // namespace

double grid_tuning_bytes(const ModelConfig& c, int64_t tokens, int64_t window) {
  const double per_layer = double(window) * double(4 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() +
                                                   3 * c.intermediate_size) +
                           double(c.n_heads) * double(window) * double(window);
  return 4.0 * (double(tokens / window * window) * double(c.vocab_size) + double(c.n_layers) * per_layer +
                2.0 * double(window) * double(c.vocab_size));
}

void tune_int4_grids(const ModelConfig& c, const ModelWeights& teacher, ModelWeights& student, ThreadPool& pool,
                     std::span<const int32_t> tokens, const GridTuneOptions& o,
                     const std::function<void(const GridTuneReport&)>& report) {
  const int64_t windows = int64_t(tokens.size()) / o.window, vocab = c.vocab_size;
  KILN_CHECK(windows >= 1, invalid_argument, "grid tuning needs at least one window of {} tokens, got {}", o.window,
             tokens.size());
  KILN_CHECK(o.epochs >= 1 && o.lr > 0, invalid_argument, "grid tuning needs epochs >= 1 and a positive rate");
  KILN_CHECK(teacher.layers.size() == student.layers.size() && teacher.embed.rows == student.embed.rows, invalid_argument,
             "the teacher ({} layers, vocabulary {}) is not the student's shape ({} layers, vocabulary {})",
             teacher.layers.size(), teacher.embed.rows, student.layers.size(), student.embed.rows);
  // The int4 matrices' grids, and where each (layer, matrix) has its own (-1: not int4, left alone).
  std::vector<Grid> grids;
  std::vector<std::array<int, kLayerMatrices>> grid_of(student.layers.size());
  for (size_t l = 0; l < student.layers.size(); ++l)
    for (int m = 0; m < kLayerMatrices; ++m) {
      HostMatrix& h = layer_matrix(student.layers[l], LayerMatrix(m));
      grid_of[l][size_t(m)] = h.quant.format == QuantFormat::int4 ? int(grids.size()) : -1;
      if (h.quant.format == QuantFormat::int4) grids.emplace_back(h, o.per_row);
    }

  // The teacher's log-probabilities of every calibration token, computed once.
  const size_t per_window = size_t(o.window * vocab);
  std::vector<float> target(size_t(windows) * per_window);
  for (int64_t w = 0; w < windows; ++w) {
    std::vector<float> logits;
    model_logits(c, teacher, pool, tokens.subspan(size_t(w * o.window), size_t(o.window)), logits);
    log_softmax_rows(logits.data(), o.window, vocab);
    std::copy(logits.begin(), logits.end(), target.begin() + ptrdiff_t(w * per_window));
  }

  // The rate decays from lr to 0 over the run on a half cosine, so that the last windows' gradients do
  // not leave the grids wherever one window's noise put them.
  const int64_t steps = windows * o.epochs;
  int64_t step = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch)
    for (int64_t w = 0; w < windows; ++w) {
      const auto t0 = std::chrono::steady_clock::now();
      const float* lp = target.data() + w * per_window;
      // KL(p || q) averaged over the window's tokens; its gradient in the logits is (q - p) / n.
      auto kl = [&](const float* logits, float* dlogits, int64_t n, int64_t nv) {
        std::copy(logits, logits + n * nv, dlogits);
        log_softmax_rows(dlogits, n, nv);
        double total = 0;
        for (int64_t i = 0; i < n * nv; ++i) {
          const double p = std::exp(double(lp[i])), lq = dlogits[i];
          total += p * (double(lp[i]) - lq);
          dlogits[i] = float((std::exp(lq) - p) / double(n));
        }
        return total / double(n);
      };
      const double value = model_gradient(c, student, pool, tokens.subspan(size_t(w * o.window), size_t(o.window)), kl,
                                          [&](int64_t layer, LayerMatrix m, const float* g) {
                                            const int at = grid_of[size_t(layer)][size_t(m)];
                                            if (at >= 0) grids[size_t(at)].gradient(g);
                                          });
      const double rate = o.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * double(step) / double(steps)));
      ++step;
      for (Grid& grid : grids) grid.adam_step(rate, step);
      report({epoch, w, windows, value,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
    }
}

}  // namespace kiln::quant
