// The decode megakernel's trace summary (host): MegakernelStep::trace, downloaded, as a table.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/megakernel/decode_megakernel.h"
#include "kernels/cuda/megakernel/megakernel_plan.cuh"

namespace kiln::cuda {

using namespace mk;

int64_t megakernel_trace_words(const MegakernelModel& m) {
  return int64_t(device_sm_count()) * trace_block_words(m.n_layers);
}

std::string megakernel_trace_summary(const MegakernelModel& m, const uint64_t* trace) {
  const int G = device_sm_count(), L = m.n_layers;
  const char* names[kPhases] = {"qkv", "attention", "o", "gate/up", "down"};
  double wait_mean[kPhases] = {}, wait_max[kPhases] = {}, work_mean[kPhases] = {}, work_max[kPhases] = {},
         part[kPhases][5] = {}, stall = 0;
  uint64_t first = ~0ull, last = 0;
  // ns per SM cycle of each block, from its start and end (clocks move with the power limit)
  std::vector<double> ns_per_cycle(size_t(G), 0.0);
  for (int b = 0; b < G; ++b) {
    const uint64_t* t = trace + int64_t(b) * trace_block_words(L);
    const uint64_t* ck = t + trace_clock_offset(L);
    ns_per_cycle[size_t(b)] = ck[1] > ck[0] ? double(ck[2] - t[0]) / double(ck[1] - ck[0]) : 0.0;
  }
  for (int l = 0; l < L; ++l)
    for (int ph = 0; ph < kPhases; ++ph) {
      double wmax = 0, kmax = 0;
      for (int b = 0; b < G; ++b) {
        const uint64_t* t = trace + int64_t(b) * trace_block_words(L);
        const uint64_t* e = t + 2 + (l * kPhases + ph) * kPhaseWords;
        const uint64_t prev_done = l == 0 && ph == 0 ? t[1] : e[1 - kPhaseWords];  // the phase before's done
        const double wait = double(int64_t(e[0] - prev_done)) * 1e-3, work = double(int64_t(e[1] - e[0])) * 1e-3;
        wait_mean[ph] += wait / (G * L);
        work_mean[ph] += work / (G * L);
        for (int i = 0; i < 5; ++i) part[ph][i] += double(e[2 + i]) * ns_per_cycle[size_t(b)] * 1e-3 / (G * L);
        wmax = std::max(wmax, wait);
        kmax = std::max(kmax, work);
        first = std::min(first, t[0]);
        last = std::max(last, e[1]);
      }
      wait_max[ph] += wmax / L;
      work_max[ph] += kmax / L;
    }
  for (int b = 0; b < G; ++b)
    for (int l = 0; l < L; ++l)
      stall += double(trace[trace_producer_offset(L, b) + l]) * ns_per_cycle[size_t(b)] * 1e-3 / (G * L);
  std::string out = "megakernel phases (us a layer: mean / max over the " + std::to_string(G) + " blocks, averaged over " +
                    std::to_string(L) + " layers; the work's parts are thread 0's)\n";
  char line[200];
  std::snprintf(line, sizeof line, "| %-9s | %15s | %15s | %9s | %9s | %9s | %9s | %9s |\n", "phase", "wait before",
                "work", "ring wait", "products", "release", "tile bar", "epilogue");
  out += line;
  double sum = 0;
  for (int ph = 0; ph < kPhases; ++ph) {
    std::snprintf(line, sizeof line, "| %-9s | %6.2f / %6.2f | %6.2f / %6.2f | %9.2f | %9.2f | %9.2f | %9.2f | %9.2f |\n",
                  names[ph], wait_mean[ph], wait_max[ph], work_mean[ph], work_max[ph], part[ph][0], part[ph][1],
                  part[ph][2], part[ph][3], part[ph][4]);
    out += line;
    sum += wait_mean[ph] + work_mean[ph];
  }
  std::snprintf(line, sizeof line,
                "a layer %.2f us (mean wait + work); the kernel %.1f us from its first block's start to its last "
                "phase; producer waiting for a free slot %.2f us a layer\n",
                sum, double(last - first) * 1e-3, stall);
  out += line;
  return out;
}

}  // namespace kiln::cuda
