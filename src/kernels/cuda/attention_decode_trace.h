// Where the streaming decode attention's blocks spend their time (KILN_ATTN_STREAM_TRACE=1; a
// diagnostic, off by default; block_trace.h). CUPTI's timeline gives each kernel's first start and
// last end; under PDL what matters is inside: how long a block waited for the kernel before, how
// long its q and newest K/V row took to land after the wait, its tiles, its merge and store. With
// the switch on, thread 0 of each of a launch's first kBlocks blocks stamps those points.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/block_trace.h"

namespace kiln::cuda {

struct DecodeStreamTrace {
  static constexpr int kSlots = 64, kBlocks = 16;
  // A block's own points (kAttendDone / kMergeDone: its last pair's, before its warps' merge and
  // after its heads' store), after block_trace.h's common words.
  enum Word { kAfterWait = kTraceFirstOwn, kPrologueDone, kAttendDone, kMergeDone, kTilesDone, kWords };
};

// Allocates the record area when the switch is on (at backend set-up, before any graph capture).
void decode_stream_trace_prepare();

// The record area for the next launch (kBlocks x kWords words), or nullptr when the switch is off.
uint64_t* decode_stream_trace_next_slot();

// The recorded launches as a table of medians (µs; cycles converted at the clock the records
// imply), or "" when the switch is off or nothing was recorded.
std::string decode_stream_trace_report();

}  // namespace kiln::cuda
