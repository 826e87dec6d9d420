#include "quant/int4_descent.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/check.h"
#include "quant/quantize.h"

namespace kiln::quant {

Int4DescentResult int4_coordinate_descent(const float* w, QuantizedMatrix& q, const std::vector<double>& H,
                                          int max_sweeps, ThreadPool& pool) {
  KILN_CHECK(q.format == QuantFormat::int4, internal, "coordinate descent runs on int4 codes");
  const int64_t n = q.cols, group = q.group_size, G = q.groups();
  KILN_CHECK(int64_t(H.size()) == n * n, internal, "a {}-column matrix against a Hessian of {} entries", n, H.size());
  std::atomic<int64_t> moves{0}, most_sweeps{0};
  pool.parallel_for(q.rows, [&](int64_t lo, int64_t hi) {
    std::vector<float> dq(static_cast<size_t>(n));
    std::vector<double> r(static_cast<size_t>(n));
    int64_t local_moves = 0, local_sweeps = 0;
    for (int64_t row = lo; row < hi; ++row) {
      const float* wr = w + row * n;
      const float* scales = q.scales.data() + row * G;
      const float* mins = q.mins.data() + row * G;
      dequantize_row(q, row, dq.data());
      // r = H d, d = w - dequantized (the values as the kernels compute them: fp32 code * scale + min).
      for (int64_t a = 0; a < n; ++a) {
        const double* ha = H.data() + a * n;
        double s = 0;
        for (int64_t b = 0; b < n; ++b) s += ha[b] * (double(wr[b]) - double(dq[size_t(b)]));
        r[size_t(a)] = s;
      }
      int sweep = 0;
      for (bool moved = true; moved && sweep < max_sweeps; ++sweep) {
        moved = false;
        for (int64_t j = 0; j < n; ++j) {
          const double hjj = H[size_t(j * n + j)];
          if (!(hjj > 0)) continue;  // an input that is always zero: any code is as good
          const int64_t g = j / group;
          const float scale = scales[g], mn = mins[g];
          const int64_t at = row * n + j;
          const int code = int4_code(q, at);
          // The value that zeroes the error's slope along j is dq_j + r_j / H_jj; its nearest code.
          const double target = (double(dq[size_t(j)]) + r[size_t(j)] / hjj - double(mn)) / double(scale);
          if (!std::isfinite(target)) continue;  // a zero or non-finite scale: leave the code
          const int best = int(std::clamp(std::nearbyint(target), 0.0, 15.0));
          if (best == code) continue;
          const float value = float(best) * scale + mn;
          const double step = double(value) - double(dq[size_t(j)]);  // the value moves by step, d_j by -step
          if (!(-2.0 * step * r[size_t(j)] + step * step * hjj < 0.0)) continue;
          set_int4_code(q, at, float(best));
          dq[size_t(j)] = value;
          const double* hj = H.data() + j * n;  // H is symmetric: column j is row j
          for (int64_t a = 0; a < n; ++a) r[size_t(a)] -= step * hj[a];
          moved = true;
          ++local_moves;
        }
      }
      local_sweeps = std::max<int64_t>(local_sweeps, sweep);
    }
    moves += local_moves;
    int64_t prev = most_sweeps.load();
    while (local_sweeps > prev && !most_sweeps.compare_exchange_weak(prev, local_sweeps)) {
    }
  });
  return {moves.load(), most_sweeps.load()};
}

}  // namespace kiln::quant
