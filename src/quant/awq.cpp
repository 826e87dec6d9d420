#include "quant/awq.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "core/check.h"
#include "quant/quantize.h"

namespace kiln::quant {
namespace {

constexpr int kGrid = 20;

// Q(W diag(s)) diag(1/s) - W, the error matrix of one candidate.
std::vector<float> scaled_error(const HostMatrix& w, const std::vector<float>& s, int64_t group) {
  const int64_t rows = w.rows, cols = w.cols;
  std::vector<float> scaled(w.data.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) scaled[size_t(r * cols + c)] = w.data[size_t(r * cols + c)] * s[size_t(c)];
  const QuantizedMatrix q = quantize_int4(scaled.data(), rows, cols, int4_group_for(cols, group));
  dequantize(q, scaled.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      scaled[i] = scaled[i] / s[size_t(c)] - w.data[i];
    }
  return scaled;
}

// sum over sample rows of || x D^T ||^2.
double output_error(const SiteStats& x, const std::vector<float>& d, int64_t rows, ThreadPool& pool) {
  std::vector<float> y(size_t(x.n_samples * rows));
  cpu::matmul(pool, x.samples.data(), d.data(), nullptr, y.data(), x.n_samples, rows, x.cols);
  double e = 0;
  for (float v : y) e += double(v) * v;
  return e;
}

// The candidate scales for alpha, normalized as AWQ does (s / sqrt(max s * min s)).
std::vector<float> scales_for(const std::vector<float>& mean_abs, float alpha) {
  std::vector<float> s(mean_abs.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = std::pow(std::max(mean_abs[i], 1e-4f), alpha);
  const auto [lo, hi] = std::minmax_element(s.begin(), s.end());
  const float norm = std::sqrt(*lo * *hi);
  for (float& v : s) v /= norm;
  return s;
}

// Searches alpha for matrices `ws` reading site stats `x`, with per-channel statistic `mean_abs`.
AwqChoice search(const std::vector<HostMatrix*>& ws, const SiteStats& x, const std::vector<float>& mean_abs,
                 ThreadPool& pool, int64_t group, std::vector<float>& best_s) {
  AwqChoice choice;
  choice.error = -1;
  for (int g = 0; g <= kGrid; ++g) {
    const float alpha = float(g) / kGrid;
    const std::vector<float> s = scales_for(mean_abs, alpha);
    double err = 0;
    for (const HostMatrix* w : ws) err += output_error(x, scaled_error(*w, s, group), w->rows, pool);
    if (g == 0) choice.error_rtn = err;
    if (choice.error < 0 || err < choice.error) {
      choice.error = err;
      choice.alpha = alpha;
      best_s = s;
    }
  }
  return choice;
}

// Quantize-dequantize one int4 group as quantize_int4 does.
void fake_int4_group(const float* w, int64_t n, float* out) {
  const Int4Grid grid = int4_grid(w, n);
  for (int64_t i = 0; i < n; ++i) out[i] = grid.value(grid.code(w[i]));
}

// AWQ's clipping search on one matrix (awq.h): x holds n rows of the matrix's inputs as it sees
// them (n x cols). Clips m in place; returns {objective unclipped, objective clipped}.
std::pair<double, double> clip_matrix(HostMatrix& m, const std::vector<float>& x, int64_t n, int64_t preferred_group,
                                      ThreadPool& pool) {
  const int64_t rows = m.rows, cols = m.cols, gs = int4_group_for(cols, preferred_group);
  if (gs == 0 || n == 0) return {0.0, 0.0};
  const int64_t groups = cols / gs;
  std::vector<float> gram(size_t(groups * gs * gs));  // per column group: X_g^T X_g
  pool.parallel_for(groups, [&](int64_t lo, int64_t hi) {
    std::vector<double> acc(size_t(gs * gs));
    for (int64_t g = lo; g < hi; ++g) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t i = 0; i < n; ++i) {
        const float* xg = x.data() + i * cols + g * gs;
        for (int64_t a = 0; a < gs; ++a)
          for (int64_t b = 0; b < gs; ++b) acc[size_t(a * gs + b)] += double(xg[a]) * xg[b];
      }
      for (size_t k = 0; k < acc.size(); ++k) gram[size_t(g * gs * gs) + k] = float(acc[k]);
    }
  });
  constexpr int kSteps = 10;  // r = 1 - i / 20, i = 0 .. 10: 1.0 down to 0.5
  std::vector<double> before(static_cast<size_t>(rows)), after(static_cast<size_t>(rows));
  pool.parallel_for(rows, [&](int64_t lo, int64_t hi) {
    std::vector<float> clipped(static_cast<size_t>(gs)), q(static_cast<size_t>(gs)), d(static_cast<size_t>(gs));
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        float* w = m.data.data() + r * cols + g * gs;
        const float* G = gram.data() + g * gs * gs;
        float amax = 0;
        for (int64_t c = 0; c < gs; ++c) amax = std::max(amax, std::fabs(w[c]));
        double best = -1;
        float best_lim = amax;
        for (int i = 0; i <= kSteps; ++i) {
          const float lim = amax * (1.0f - float(i) / (2 * kSteps));
          for (int64_t c = 0; c < gs; ++c) clipped[size_t(c)] = std::clamp(w[c], -lim, lim);
          fake_int4_group(clipped.data(), gs, q.data());
          for (int64_t c = 0; c < gs; ++c) d[size_t(c)] = w[c] - q[size_t(c)];
          double e = 0;
          for (int64_t a = 0; a < gs; ++a) {
            float row = 0;
            for (int64_t b = 0; b < gs; ++b) row += G[a * gs + b] * d[size_t(b)];
            e += double(d[size_t(a)]) * row;
          }
          if (i == 0) before[size_t(r)] += e;
          if (best < 0 || e < best) {
            best = e;
            best_lim = lim;
          }
        }
        after[size_t(r)] += best;
        for (int64_t c = 0; c < gs; ++c) w[c] = std::clamp(w[c], -best_lim, best_lim);
      }
  });
  double b = 0, a = 0;
  for (int64_t r = 0; r < rows; ++r) b += before[size_t(r)], a += after[size_t(r)];
  return {b, a};
}

// A site's calibration rows as the scaled weights see them: x_i / s_i.
std::vector<float> scaled_samples(const SiteStats& x, const std::vector<float>& s) {
  std::vector<float> out(x.samples.size());
  for (int64_t i = 0; i < x.n_samples; ++i)
    for (int64_t c = 0; c < x.cols; ++c)
      out[size_t(i * x.cols + c)] = x.samples[size_t(i * x.cols + c)] / s[size_t(c)];
  return out;
}

void scale_columns(HostMatrix& w, const std::vector<float>& s) {
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) w.data[size_t(r * w.cols + c)] *= s[size_t(c)];
}

// Divides row r (or element r of a (1, n) vector) by s[r].
void divide_rows(HostMatrix& w, const std::vector<float>& s) {
  if (w.empty()) return;
  const bool vector = w.rows == 1;
  const int64_t n = vector ? w.cols : w.rows, len = vector ? 1 : w.cols;
  KILN_CHECK(int64_t(s.size()) == n, internal, "AWQ fold: {} scales for {} rows", s.size(), n);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < len; ++c) w.data[size_t(r * len + c)] /= s[size_t(r)];
}

}  // namespace

void apply_awq(ModelWeights& w, const ModelConfig& c, const Calibration& cal, ThreadPool& pool, int64_t int4_group,
               bool clip, const std::function<void(const AwqChoice&)>& on_choice) {
  KILN_CHECK(int64_t(cal.layers.size()) == c.n_layers, internal, "calibration has {} layers, the model {}",
             cal.layers.size(), c.n_layers);
  const int64_t group = c.n_heads / c.n_kv_heads, hd = c.head_dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    const auto& sites = cal.layers[size_t(l)];
    std::vector<float> s;
    AwqChoice chosen[4];  // qkv, o, gate_up, down: reported once the layer is scaled (and clipped)
    std::vector<float> site_s[4];
    int next = 0;
    auto report = [&](AwqChoice ch, const char* name) {
      ch.layer = l;
      ch.group = name;
      site_s[next] = s;
      chosen[next++] = ch;
    };

    // q, k, v: fold 1/s into attn_norm.
    const SiteStats& attn_in = sites[size_t(LinearSite::attn_in)];
    report(search({&L.wq, &L.wk, &L.wv}, attn_in, attn_in.mean_abs(), pool, int4_group, s), "qkv");
    for (HostMatrix* m : {&L.wq, &L.wk, &L.wv}) scale_columns(*m, s);
    divide_rows(L.attn_norm, s);

    // o: scales tied across the query heads of one kv head; fold 1/s into v's rows (and bias).
    const SiteStats& attn_out = sites[size_t(LinearSite::attn_out)];
    std::vector<float> per_head = attn_out.mean_abs(), tied(per_head.size());
    for (int64_t kvh = 0; kvh < c.n_kv_heads; ++kvh)
      for (int64_t d = 0; d < hd; ++d) {
        float sum = 0;
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) sum += per_head[size_t(h * hd + d)];
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) tied[size_t(h * hd + d)] = sum / float(group);
      }
    report(search({&L.wo}, attn_out, tied, pool, int4_group, s), "o");
    scale_columns(L.wo, s);
    std::vector<float> s_kv(size_t(c.kv_dim()));
    for (int64_t kvh = 0; kvh < c.n_kv_heads; ++kvh)
      for (int64_t d = 0; d < hd; ++d) s_kv[size_t(kvh * hd + d)] = s[size_t(kvh * group * hd + d)];
    divide_rows(L.wv, s_kv);
    divide_rows(L.bv, s_kv);

    // gate, up: fold 1/s into ffn_norm.
    const SiteStats& mlp_in = sites[size_t(LinearSite::mlp_in)];
    report(search({&L.w_gate, &L.w_up}, mlp_in, mlp_in.mean_abs(), pool, int4_group, s), "gate_up");
    for (HostMatrix* m : {&L.w_gate, &L.w_up}) scale_columns(*m, s);
    divide_rows(L.ffn_norm, s);

    // down: fold 1/s into up's rows.
    const SiteStats& mlp_act = sites[size_t(LinearSite::mlp_act)];
    report(search({&L.w_down}, mlp_act, mlp_act.mean_abs(), pool, int4_group, s), "down");
    scale_columns(L.w_down, s);
    divide_rows(L.w_up, s);

    // Clipping, on the layer's final scaled weights (up has had both of its scalings).
    if (clip) {
      const LinearSite site_of[4] = {LinearSite::attn_in, LinearSite::attn_out, LinearSite::mlp_in,
                                     LinearSite::mlp_act};
      const std::vector<HostMatrix*> clipped[4] = {{&L.wv}, {&L.wo}, {&L.w_gate, &L.w_up}, {&L.w_down}};
      for (int k = 0; k < 4; ++k) {
        const SiteStats& x = sites[size_t(site_of[k])];
        const std::vector<float> xs = scaled_samples(x, site_s[k]);
        for (HostMatrix* m : clipped[k]) {
          const auto [before, after] = clip_matrix(*m, xs, x.n_samples, int4_group, pool);
          chosen[k].clip_error_before += before;
          chosen[k].clip_error_after += after;
        }
      }
    }
    for (const AwqChoice& ch : chosen)
      if (on_choice) on_choice(ch);
  }
}

}  // namespace kiln::quant
