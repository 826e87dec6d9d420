// Where the int8 / int4 decode GEMV's blocks spend their time in a step (KILN_QGEMV_TRACE=RxC, the
// launches over an R x C weight, e.g. 28672x4096 for Llama-3-8B's gate/up; a diagnostic, off by
// default; block_trace.h). In the batch-1 step the big GEMVs' critical shares run 50-70% over
// their bytes at the copy rate (performance/decode-critical-path.md, session 27): this splits a launch into
// the blocks' lead before the wait, x's staging, the first tile, the steady tiles and the tail,
// and names each launch's last block out (its entry, lateness, staging, tiles, index and how many
// of the launch's blocks shared its SM).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/block_trace.h"

namespace kiln::cuda {

struct QgemvTrace {
  static constexpr int kSlots = 32, kBlocks = 1024;
  // A block's own points: its wait returned, x staged (= the wait without staging), and how many
  // 16-row tiles it ran. (A stamp at its first tile's end, inside the stream loop, cost the int4 /
  // int8 qkv GEMVs a register spill: left out, the tiles are timed together.)
  enum Word { kAfterWait = kTraceFirstOwn, kStaged, kTiles, kWords };
};

// Allocates the record area when the switch is on (at backend set-up, before any graph capture).
void qgemv_trace_prepare();

// The record area for the next launch over a rows x cols weight, or nullptr (switch off, another
// shape, or never prepared).
uint64_t* qgemv_trace_next_slot(int64_t rows, int64_t cols);

// The traced launches as a table of medians (µs), or "" when off or nothing was recorded.
std::string qgemv_trace_report();

}  // namespace kiln::cuda
