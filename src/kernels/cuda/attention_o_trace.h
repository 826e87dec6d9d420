// Where the fused attention + o kernel's blocks spend their time (KILN_ATTN_O_TRACE=1; a diagnostic,
// off by default; block_trace.h). Session 29 measured the kernel 5% slower end to end than the
// attention and o GEMV it replaces, without seeing inside it: these stamps split a block's life into
// its lead before the PDL wait, q and the first tile landing, the attention (tiles and merge), the
// product with its o weights, and the partials' exchange (the slice's last block adds them).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/block_trace.h"

namespace kiln::cuda {

struct AttnOTrace {
  static constexpr int kSlots = 32, kBlocks = 512;
  // A block's own points, after block_trace.h's common words: its wait returned, its first tile
  // and q in shared memory, its attention output and x sums ready, its partial products written.
  enum Word { kAfterWait = kTraceFirstOwn, kFirstTile, kMerged, kProduct, kWords };
};

// Allocates the record area when the switch is on (at backend set-up, before any graph capture).
void attention_o_trace_prepare();

// The record area for the next launch (kBlocks x kWords words), or nullptr when the switch is off.
uint64_t* attention_o_trace_next_slot();

// The recorded launches as a table of medians (µs), or "" when off or nothing was recorded.
std::string attention_o_trace_report();

}  // namespace kiln::cuda
