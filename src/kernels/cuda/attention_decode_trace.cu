// KILN_ATTN_STREAM_TRACE=1: the streaming decode attention's per-block records (attention_decode_trace.h).
#include "kernels/cuda/attention_decode_trace.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"

namespace kiln::cuda {
namespace {

using T = DecodeStreamTrace;
constexpr size_t kSlotWords = size_t(T::kBlocks) * T::kWords;

struct TraceState {
  std::mutex mu;
  uint64_t* device = nullptr;
  int next = 0;
  int used = 0;
};

TraceState& state() {
  static TraceState s;
  return s;
}

bool trace_on() {
  static const bool on = env_int("KILN_ATTN_STREAM_TRACE", 0) != 0;
  return on;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void decode_stream_trace_prepare() {
  if (!trace_on()) return;
  TraceState& s = state();
  std::lock_guard lock(s.mu);
  if (s.device) return;
  KILN_CUDA_CHECK(cudaMalloc(&s.device, T::kSlots * kSlotWords * sizeof(uint64_t)));
  KILN_CUDA_CHECK(cudaMemset(s.device, 0, T::kSlots * kSlotWords * sizeof(uint64_t)));
}

uint64_t* decode_stream_trace_next_slot() {
  if (!trace_on()) return nullptr;
  TraceState& s = state();
  std::lock_guard lock(s.mu);
  if (!s.device) return nullptr;  // a backend that never prepared it: that launch goes untraced
  uint64_t* slot = s.device + size_t(s.next) * kSlotWords;
  s.next = (s.next + 1) % T::kSlots;
  s.used = std::min(s.used + 1, int(T::kSlots));
  return slot;
}

std::string decode_stream_trace_report() {
  if (!trace_on()) return "";
  TraceState& s = state();
  std::lock_guard lock(s.mu);
  if (!s.device || s.used == 0) return "";
  std::vector<uint64_t> h(T::kSlots * kSlotWords);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  KILN_CUDA_CHECK(cudaMemcpy(h.data(), s.device, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  // The SM clock the records imply: all blocks' cycles over all blocks' nanoseconds, entry to exit.
  double cycles = 0, ns = 0;
  for (int slot = 0; slot < s.used; ++slot)
    for (int b = 0; b < T::kBlocks; ++b) {
      const uint64_t* r = &h[slot * kSlotWords + size_t(b) * T::kWords];
      if (r[T::kExit] == 0 || r[T::kExitNs] <= r[T::kEntryNs]) continue;
      cycles += double(r[T::kExit] - r[T::kEntry]);
      ns += double(r[T::kExitNs] - r[T::kEntryNs]);
    }
  if (ns <= 0) return "";
  const double ghz = cycles / ns;
  auto us = [&](uint64_t from, uint64_t to) { return double(to - from) / ghz / 1000.0; };
  // Per launch: each block's intervals, and the launch's spread (last exit minus first wait return).
  std::vector<double> wait, land, attend, merge, tiles, tail, total, spread, wait_skew, exit_skew;
  int launches = 0, blocks = 0;
  for (int slot = 0; slot < s.used; ++slot) {
    uint64_t first_wait_ns = UINT64_MAX, last_wait_ns = 0, first_exit_ns = UINT64_MAX, last_exit_ns = 0;
    bool any = false;
    for (int b = 0; b < T::kBlocks; ++b) {
      const uint64_t* r = &h[slot * kSlotWords + size_t(b) * T::kWords];
      if (r[T::kExit] == 0 || r[T::kAfterWait] == 0) continue;  // no record, or not the early-rows prologue
      any = true;
      ++blocks;
      wait.push_back(us(r[T::kEntry], r[T::kAfterWait]));
      land.push_back(us(r[T::kAfterWait], r[T::kPrologueDone]));
      attend.push_back(us(r[T::kPrologueDone], r[T::kAttendDone]));
      merge.push_back(us(r[T::kAttendDone], r[T::kMergeDone]));
      tiles.push_back(us(r[T::kPrologueDone], r[T::kTilesDone]));
      tail.push_back(us(r[T::kTilesDone], r[T::kExit]));
      total.push_back(us(r[T::kEntry], r[T::kExit]));
      const uint64_t wait_ns = r[T::kEntryNs] + uint64_t(us(r[T::kEntry], r[T::kAfterWait]) * 1000.0);
      first_wait_ns = std::min(first_wait_ns, wait_ns);
      last_wait_ns = std::max(last_wait_ns, wait_ns);
      first_exit_ns = std::min(first_exit_ns, r[T::kExitNs]);
      last_exit_ns = std::max(last_exit_ns, r[T::kExitNs]);
    }
    if (any) {
      ++launches;
      spread.push_back(double(last_exit_ns - first_wait_ns) / 1000.0);
      wait_skew.push_back(double(last_wait_ns - first_wait_ns) / 1000.0);
      exit_skew.push_back(double(last_exit_ns - first_exit_ns) / 1000.0);
    }
  }
  if (launches == 0) return "";
  // (snprintf, not fmt: nvcc cannot compile fmt's compile-time format strings.)
  char text[1100];
  std::snprintf(text, sizeof text,
                "decode attention trace (KILN_ATTN_STREAM_TRACE): %d launches, %d block records, SM clock %.2f GHz; "
                "medians, us:\n"
                "  resident before the wait returned        %8.2f\n"
                "  q and newest row landed after it         %8.2f\n"
                "  tiles and merges, all its pairs          %8.2f\n"
                "    of which to its last pair's merge      %8.2f\n"
                "    of which that merge and its store      %8.2f\n"
                "  exit (copies still in flight)            %8.2f\n"
                "  a block, entry to exit                   %8.2f\n"
                "  a launch, first wait return to last exit %8.2f\n"
                "    its blocks' wait returns, last - first %8.2f\n"
                "    its blocks' exits, last - first        %8.2f\n"
                "  (the launch figures from %%globaltimer, which may tick coarser than the cycles)\n",
                launches, blocks, ghz, median(wait), median(land), median(tiles), median(attend), median(merge),
                median(tail), median(total), median(spread), median(wait_skew), median(exit_skew));
  return text;
}

}  // namespace kiln::cuda
