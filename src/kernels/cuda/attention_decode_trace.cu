// KILN_ATTN_STREAM_TRACE=1: the streaming decode attention's per-block records (attention_decode_trace.h).
#include "kernels/cuda/attention_decode_trace.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/env.h"

namespace kiln::cuda {
namespace {

using T = DecodeStreamTrace;

bool trace_on() {
  static const bool on = env_int("KILN_ATTN_STREAM_TRACE", 0) != 0;
  return on;
}

}  // namespace

void decode_stream_trace_prepare() {
  if (trace_on()) block_trace_ring<T>().prepare();
}

uint64_t* decode_stream_trace_next_slot() { return trace_on() ? block_trace_ring<T>().next_slot() : nullptr; }

std::string decode_stream_trace_report() {
  if (!trace_on()) return "";
  int used = 0;
  const std::vector<uint64_t> h = block_trace_ring<T>().snapshot(&used);
  const double ghz = block_trace_ghz(h, T::kWords);
  if (used == 0 || ghz <= 0) return "";
  const auto med = block_trace_median;
  auto us = [&](uint64_t from, uint64_t to) { return double(to - from) / ghz / 1000.0; };
  // Per launch: each block's intervals, and the launch's spread (last exit minus first wait return).
  std::vector<double> wait, land, attend, merge, tiles, tail, total, spread, wait_skew, exit_skew;
  int launches = 0, blocks = 0;
  for (int slot = 0; slot < used; ++slot) {
    uint64_t first_wait_ns = UINT64_MAX, last_wait_ns = 0, first_exit_ns = UINT64_MAX, last_exit_ns = 0;
    bool any = false;
    for (int b = 0; b < T::kBlocks; ++b) {
      const uint64_t* r = block_trace_record<T>(h, slot, b);
      if (r[kTraceExit] == 0 || r[T::kAfterWait] == 0) continue;  // no record, or not the early-rows prologue
      any = true;
      ++blocks;
      wait.push_back(us(r[kTraceEntry], r[T::kAfterWait]));
      land.push_back(us(r[T::kAfterWait], r[T::kPrologueDone]));
      attend.push_back(us(r[T::kPrologueDone], r[T::kAttendDone]));
      merge.push_back(us(r[T::kAttendDone], r[T::kMergeDone]));
      tiles.push_back(us(r[T::kPrologueDone], r[T::kTilesDone]));
      tail.push_back(us(r[T::kTilesDone], r[kTraceExit]));
      total.push_back(us(r[kTraceEntry], r[kTraceExit]));
      const uint64_t wait_ns = r[kTraceEntryNs] + uint64_t(us(r[kTraceEntry], r[T::kAfterWait]) * 1000.0);
      first_wait_ns = std::min(first_wait_ns, wait_ns);
      last_wait_ns = std::max(last_wait_ns, wait_ns);
      first_exit_ns = std::min(first_exit_ns, r[kTraceExitNs]);
      last_exit_ns = std::max(last_exit_ns, r[kTraceExitNs]);
    }
    if (any) {
      ++launches;
      spread.push_back(double(last_exit_ns - first_wait_ns) / 1000.0);
      wait_skew.push_back(double(last_wait_ns - first_wait_ns) / 1000.0);
      exit_skew.push_back(double(last_exit_ns - first_exit_ns) / 1000.0);
    }
  }
  if (launches == 0) return "";
  char head[160];
  std::snprintf(head, sizeof head,
                "decode attention trace (KILN_ATTN_STREAM_TRACE): %d launches, %d block records, SM clock %.2f GHz; "
                "medians, us:\n",
                launches, blocks, ghz);
  std::string text = head;
  block_trace_line(text, "resident before the wait returned", {med(wait)});
  block_trace_line(text, "q and newest row landed after it", {med(land)});
  block_trace_line(text, "tiles and merges, all its pairs", {med(tiles)});
  block_trace_line(text, "  of which to its last pair's merge", {med(attend)});
  block_trace_line(text, "  of which that merge and its store", {med(merge)});
  block_trace_line(text, "exit (copies still in flight)", {med(tail)});
  block_trace_line(text, "a block, entry to exit", {med(total)});
  block_trace_line(text, "a launch, first wait return to last exit", {med(spread)});
  block_trace_line(text, "  its blocks' wait returns, last - first", {med(wait_skew)});
  block_trace_line(text, "  its blocks' exits, last - first", {med(exit_skew)});
  text += "  (the launch figures from %globaltimer, which may tick coarser than the cycles)\n";
  return text;
}

}  // namespace kiln::cuda
