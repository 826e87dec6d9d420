// block_trace.h's ring.
#include "kernels/cuda/block_trace.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "backend/cuda/cuda_check.h"

namespace kiln::cuda {

void BlockTraceRing::prepare() {
  std::lock_guard lock(mu_);
  if (device_) return;
  const size_t bytes = size_t(slots_) * size_t(blocks_) * size_t(words_) * sizeof(uint64_t);
  KILN_CUDA_CHECK(cudaMalloc(&device_, bytes));
  KILN_CUDA_CHECK(cudaMemset(device_, 0, bytes));
}

uint64_t* BlockTraceRing::next_slot() {
  std::lock_guard lock(mu_);
  if (!device_) return nullptr;
  uint64_t* slot = device_ + size_t(next_) * size_t(blocks_) * size_t(words_);
  next_ = (next_ + 1) % slots_;
  used_ = std::min(used_ + 1, slots_);
  return slot;
}

std::vector<uint64_t> BlockTraceRing::snapshot(int* used) {
  std::lock_guard lock(mu_);
  *used = device_ ? used_ : 0;
  std::vector<uint64_t> h(size_t(*used) * size_t(blocks_) * size_t(words_));
  if (h.empty()) return h;
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  KILN_CUDA_CHECK(cudaMemcpy(h.data(), device_, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  return h;
}

double block_trace_ghz(const std::vector<uint64_t>& records, int words) {
  double cycles = 0, ns = 0;
  for (size_t i = 0; i + size_t(words) <= records.size(); i += size_t(words)) {
    const uint64_t* r = &records[i];
    if (r[kTraceExit] <= r[kTraceEntry] || r[kTraceExitNs] <= r[kTraceEntryNs]) continue;
    cycles += double(r[kTraceExit] - r[kTraceEntry]);
    ns += double(r[kTraceExitNs] - r[kTraceEntryNs]);
  }
  return ns > 0 ? cycles / ns : 0.0;
}

double block_trace_percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

void BlockTraceSpread::add(const std::vector<double>& wait_ns, const std::vector<double>& exit_ns) {
  const double first = *std::min_element(wait_ns.begin(), wait_ns.end());
  waits.push_back((*std::max_element(wait_ns.begin(), wait_ns.end()) - first) / 1000.0);
  std::vector<double> exits;
  for (double e : exit_ns) exits.push_back((e - first) / 1000.0);
  exit50.push_back(block_trace_percentile(exits, 0.5));
  exit90.push_back(block_trace_percentile(exits, 0.9));
  exit_last.push_back(block_trace_percentile(exits, 1.0));
}

void block_trace_line(std::string& text, const char* label, std::initializer_list<double> values) {
  // (snprintf, not fmt: nvcc cannot compile fmt's compile-time format strings.)
  char cell[64];
  std::snprintf(cell, sizeof cell, "  %-46s", label);
  text += cell;
  for (const double v : values) {
    std::snprintf(cell, sizeof cell, " %8.2f", v);
    text += cell;
  }
  text += '\n';
}

}  // namespace kiln::cuda
