// Per-block timestamps of one kernel's launches, for the traces that find where a batch-1 decode
// step's microseconds go inside its kernels (KILN_ATTN_STREAM_TRACE, KILN_QGEMV_TRACE; diagnostics,
// off by default). Thread 0 of each traced block writes SM cycles (clock64) at the points its
// kernel names and %globaltimer at entry and exit into a record of `words` words; a launch's
// records fill one slot of a ring (under a CUDA graph, a slot per captured launch, rewritten every
// replay). The device side is block_trace.cuh.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kiln::cuda {

// The words every record starts with; a kernel's own points follow from kTraceFirstOwn.
enum BlockTraceWord { kTraceEntryNs, kTraceEntry, kTraceExitNs, kTraceExit, kTraceSm, kTraceFirstOwn };

class BlockTraceRing {
 public:
  BlockTraceRing(int slots, int blocks, int words) : slots_(slots), blocks_(blocks), words_(words) {}
  // Allocates the ring (at backend set-up: not allowed while a CUDA graph is being captured, where
  // the first traced launch may come). Idempotent.
  void prepare();
  // The next launch's record area (blocks x words), or nullptr when the ring was never prepared.
  uint64_t* next_slot();
  // The slots written so far (used x blocks x words words; a block's record is all zero if that
  // block never ran or was not traced), after synchronizing the device.
  std::vector<uint64_t> snapshot(int* used);

 private:
  const int slots_, blocks_, words_;
  std::mutex mu_;
  uint64_t* device_ = nullptr;
  int next_ = 0, used_ = 0;
};

// The process's ring of a trace type (its kSlots launches of kBlocks records of kWords words).
template <class Trace>
BlockTraceRing& block_trace_ring() {
  static BlockTraceRing ring(Trace::kSlots, Trace::kBlocks, Trace::kWords);
  return ring;
}
// Block b's record in slot `slot` of a snapshot of such a ring.
template <class Trace>
const uint64_t* block_trace_record(const std::vector<uint64_t>& snapshot, int slot, int b) {
  return &snapshot[(size_t(slot) * Trace::kBlocks + size_t(b)) * Trace::kWords];
}

// The SM clock (GHz) that records imply: every complete record's cycles over its nanoseconds.
double block_trace_ghz(const std::vector<uint64_t>& records, int words);
// The p-quantile (0..1) of v by rank (0.5: the upper middle), 0 when empty.
double block_trace_percentile(std::vector<double> v, double p);
inline double block_trace_median(std::vector<double> v) { return block_trace_percentile(std::move(v), 0.5); }
// A record's point `word` (SM cycles) as %globaltimer ns: its entry stamp plus its cycles since
// entry at the records' clock (ghz, block_trace_ghz).
inline double block_trace_ns(const uint64_t* record, int word, double ghz) {
  return double(record[kTraceEntryNs]) + double(record[word] - record[kTraceEntry]) / ghz;
}
// A launch's spread, one entry per launch (µs): its blocks' wait returns, last - first, and their
// exits' 50 / 90 / 100% points after the first wait return. add() takes one launch's wait returns
// and exits as %globaltimer ns (not empty).
struct BlockTraceSpread {
  std::vector<double> waits, exit50, exit90, exit_last;
  void add(const std::vector<double>& wait_ns, const std::vector<double>& exit_ns);
};
// Appends a report line to text: "  label", padded to a column, then each value as %8.2f.
void block_trace_line(std::string& text, const char* label, std::initializer_list<double> values);

}  // namespace kiln::cuda
