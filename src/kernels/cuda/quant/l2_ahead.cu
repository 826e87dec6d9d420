// Host side of l2_ahead.h: the armed ranges and the tail of a matrix.
#include "kernels/cuda/quant/l2_ahead.h"

#include <algorithm>

#include "core/env.h"

namespace kiln::cuda {
namespace {
// Armed by the host thread that enqueues the step (launches are enqueued from one thread).
thread_local L2Ahead g_armed;
}  // namespace

L2Ahead l2_ahead_tail(const QWeight& w, int64_t bytes, int delay_ns) {
  if ((w.format != QuantFormat::int8 && w.format != QuantFormat::int4) || bytes <= 0 || w.rows <= 0) return {};
  const int64_t data = qweight_data_bytes(w.format, w.rows, w.cols), row_bytes = data / w.rows;
  const int64_t scale_bytes = qweight_scale_floats(w.format, w.rows, w.cols, w.group) * 4;
  const int64_t rows = std::min(w.rows, std::max<int64_t>(1, bytes / row_bytes));
  // Starts rounded down to 16 bytes (the bulk prefetch's alignment): a few bytes of the row before.
  const int64_t w0 = (data - rows * row_bytes) & ~int64_t(15);
  const int64_t s0 = (scale_bytes - scale_bytes / w.rows * rows) & ~int64_t(15);
  L2Ahead a;
  a.w = static_cast<const char*>(w.data) + w0;
  a.w_bytes = data - w0;
  a.s = reinterpret_cast<const char*>(w.scales) + s0;
  a.s_bytes = scale_bytes - s0;
  a.delay_ns = delay_ns;
  return a;
}

L2Ahead l2_ahead_from_env(const QWeight& w, const char* kb_var) {
  const int kb = env_int(kb_var, 0);
  if (kb <= 0) return {};
  L2Ahead a = l2_ahead_tail(w, int64_t(kb) * 1024, env_int("KILN_L2_AHEAD_DELAY_NS", 0));
  a.per_line = env_int("KILN_L2_AHEAD_LINES", 0) == 1;
  return a;
}

void qgemv_arm_l2_ahead(const L2Ahead& ahead) { g_armed = ahead; }
void qgemv_disarm_l2_ahead() { g_armed = {}; }
L2Ahead qgemv_take_l2_ahead() {
  const L2Ahead a = g_armed;
  g_armed = {};
  return a;
}

}  // namespace kiln::cuda
