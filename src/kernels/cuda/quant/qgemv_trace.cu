// KILN_QGEMV_TRACE=RxC: the decode GEMV v3's per-block records (qgemv_trace.h).
#include "kernels/cuda/quant/qgemv_trace.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace kiln::cuda {
namespace {

using T = QgemvTrace;

struct Shape {
  int64_t rows = 0, cols = 0;  // 0: the switch is off
};

const Shape& traced_shape() {
  static const Shape s = [] {
    Shape shape;
    const char* v = std::getenv("KILN_QGEMV_TRACE");
    long long r = 0, c = 0;
    if (v && std::sscanf(v, "%lldx%lld", &r, &c) == 2 && r > 0 && c > 0) shape = {r, c};
    return shape;
  }();
  return s;
}

}  // namespace

void qgemv_trace_prepare() {
  if (traced_shape().rows > 0) block_trace_ring<T>().prepare();
}

uint64_t* qgemv_trace_next_slot(int64_t rows, int64_t cols) {
  const Shape& s = traced_shape();
  return s.rows == rows && s.cols == cols ? block_trace_ring<T>().next_slot() : nullptr;
}

std::string qgemv_trace_report() {
  const Shape& s = traced_shape();
  if (s.rows == 0) return "";
  int used = 0;
  const std::vector<uint64_t> h = block_trace_ring<T>().snapshot(&used);
  const double ghz = block_trace_ghz(h, T::kWords);
  if (used == 0 || ghz <= 0) return "";
  const auto med = block_trace_median;
  auto at_ns = [&](const uint64_t* r, int word) { return block_trace_ns(r, word, ghz); };
  std::vector<double> lead, staged, per_tile, blocks_n, tiles_min, tiles_max;
  // The last block to exit in each launch: how late its wait returned, its staging, its tiles, how
  // many of the launch's blocks ran on its SM, its entry and its index (sessions 45-46: a late last
  // block in some steps).
  std::vector<double> last_wait, last_staged, last_tile, last_sm_blocks, last_entry, last_index;
  BlockTraceSpread spread;
  for (int slot = 0; slot < used; ++slot) {
    std::vector<double> waits, exits;
    double tmin = 1e30, tmax = 0;
    const uint64_t* last = nullptr;
    int last_b = 0;
    for (int b = 0; b < T::kBlocks; ++b) {
      const uint64_t* r = block_trace_record<T>(h, slot, b);
      if (r[kTraceExit] == 0 || r[T::kAfterWait] == 0) continue;
      if (!last || r[kTraceExitNs] > last[kTraceExitNs]) last = r, last_b = b;
      waits.push_back(at_ns(r, T::kAfterWait));
      exits.push_back(double(r[kTraceExitNs]));
      lead.push_back((at_ns(r, T::kAfterWait) - double(r[kTraceEntryNs])) / 1000.0);
      staged.push_back((at_ns(r, T::kStaged) - at_ns(r, T::kAfterWait)) / 1000.0);
      const double tiles = double(r[T::kTiles]);
      tmin = std::min(tmin, tiles), tmax = std::max(tmax, tiles);
      if (tiles > 0) per_tile.push_back((double(r[kTraceExitNs]) - at_ns(r, T::kStaged)) / 1000.0 / tiles);
    }
    if (waits.empty()) continue;
    const double first_wait = *std::min_element(waits.begin(), waits.end());
    last_wait.push_back((at_ns(last, T::kAfterWait) - first_wait) / 1000.0);
    last_entry.push_back((double(last[kTraceEntryNs]) - first_wait) / 1000.0);
    last_index.push_back(double(last_b));
    last_staged.push_back((at_ns(last, T::kStaged) - at_ns(last, T::kAfterWait)) / 1000.0);
    last_tile.push_back((double(last[kTraceExitNs]) - at_ns(last, T::kStaged)) / 1000.0 /
                        std::max(1.0, double(last[T::kTiles])));
    int on_its_sm = 0;
    for (int b = 0; b < T::kBlocks; ++b) {
      const uint64_t* r = block_trace_record<T>(h, slot, b);
      on_its_sm += r[kTraceExit] != 0 && r[T::kAfterWait] != 0 && r[kTraceSm] == last[kTraceSm];
    }
    last_sm_blocks.push_back(double(on_its_sm));
    spread.add(waits, exits);
    blocks_n.push_back(double(waits.size()));
    tiles_min.push_back(tmin);
    tiles_max.push_back(tmax);
  }
  const int launches = int(blocks_n.size());
  if (launches == 0) return "";
  char head[256];
  std::snprintf(head, sizeof head,
                "decode GEMV trace (KILN_QGEMV_TRACE=%lldx%lld): %d launches of %.0f blocks (%.0f-%.0f tiles a block), "
                "SM clock %.2f GHz; medians, us:\n",
                (long long)s.rows, (long long)s.cols, launches, med(blocks_n), med(tiles_min), med(tiles_max), ghz);
  std::string text = head;
  block_trace_line(text, "a block resident before its wait returned", {med(lead)});
  block_trace_line(text, "the launch's wait returns, last - first", {med(spread.waits)});
  block_trace_line(text, "a block's x staged after its wait", {med(staged)});
  block_trace_line(text, "then a 16-row tile (its tiles to its exit / n)", {med(per_tile)});
  block_trace_line(text, "exits after the first wait return: 50 / 90 / 100%",
                   {med(spread.exit50), med(spread.exit90), med(spread.exit_last)});
  block_trace_line(text, "last block out: wait late / x staged / tile",
                   {med(last_wait), med(last_staged), med(last_tile)});
  block_trace_line(text, "last block out: blocks on its SM, median / min",
                   {med(last_sm_blocks), block_trace_percentile(last_sm_blocks, 0.0)});
  block_trace_line(text, "last block out: entry after the first wait return", {med(last_entry)});
  block_trace_line(text, "last block out: its index, median / min / max",
                   {med(last_index), block_trace_percentile(last_index, 0.0),
                    block_trace_percentile(last_index, 1.0)});
  text += "  (from %globaltimer at entry and exit and the cycles between)\n";
  return text;
}

}  // namespace kiln::cuda
