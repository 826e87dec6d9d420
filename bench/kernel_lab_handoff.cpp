// `kernel_lab --handoff`: what one kernel boundary costs (kernels/cuda/handoff_probe.h), the three
// handoffs side by side in one run. A batch-1 decode step is ~7 kernels a layer whose work is a
// few µs each; session 27's trace put ~2.4 µs between the qkv GEMV's end and the attention's
// griddepcontrol.wait returning. If a counter polled at GPU scope hands over much sooner than
// the grid-completion wait, chaining the step's kernels by counters is worth building; if not, the
// boundary is what it is and only fewer kernels remove it.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernel_lab.h"
#include "kernels/cuda/handoff_probe.h"

namespace kiln::lab {

using namespace kiln::cuda;

void bench_handoff(int sm_count) {
  constexpr int kKernels = 200, kRounds = 5, kThreads = 256;
  const char* names[] = {"plain", "pdl", "flag"};
  const Handoff modes[] = {Handoff::plain, Handoff::pdl, Handoff::flag};
  std::printf("\nkernel handoff: chains of %d kernels, %d threads a block; us per kernel, median of %d chains "
              "(busy 0: the boundary alone)\n",
              kKernels, kThreads, kRounds);
  std::printf("%8s %12s %10s %10s %10s %7s\n", "blocks", "busy cycles", "plain", "pdl", "flag", "stale");
  for (const int blocks : {8, sm_count, 2 * sm_count}) {
    for (const int64_t busy : {int64_t(0), int64_t(4000), int64_t(10000)}) {
      double us[3] = {0, 0, 0};
      int stale = 0;
      for (int m = 0; m < 3; ++m) {
        handoff_chain(modes[m], kKernels, blocks, kThreads, busy, nullptr);  // warm-up
        std::vector<double> t;
        int mode_stale = 0;
        for (int r = 0; r < kRounds; ++r) {
          const HandoffTiming h = handoff_chain(modes[m], kKernels, blocks, kThreads, busy, nullptr);
          t.push_back(h.us_per_kernel);
          mode_stale += h.stale_reads;
        }
        std::sort(t.begin(), t.end());
        us[m] = t[t.size() / 2];
        stale += mode_stale;
        char shape[64];
        std::snprintf(shape, sizeof shape, "blocks=%d busy=%lld", blocks, (long long)busy);
        record("handoff", shape, names[m], us[m] / 1000.0, 0, 0, 0, double(mode_stale));
      }
      std::printf("%8d %12lld %10.2f %10.2f %10.2f %7d\n", blocks, (long long)busy, us[0], us[1], us[2], stale);
    }
  }
  std::printf("(4000 / 10000 busy cycles: ~2.0 / ~5.1 us at 1.98 GHz; stale: reads of the predecessor's value "
              "before it was written, must be 0)\n");
}

}  // namespace kiln::lab
