// Per-launch tile counters: a kernel that deals part of its work at run time (qgemv v3, KILN_QGEMV_DEAL)
// draws its next tile from one of these with atomicAdd. Each launch gets the next counter of a ring of
// zeroed ones, and the launch's last draw puts it back to zero (the kernel knows how many draws it
// makes: every valid tile plus one failed draw per block), so no memset node stands between kernels
// (one would cut their PDL edges) and a captured graph can replay its launches as they were.
//
// Two launches share a counter only kRing launches apart; a kernel draws only after its
// griddepcontrol.wait, which returns when the launches before it on the stream have finished.
// One device per process (the ring lives on the device current at its first use).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

struct TileCounters {
  static constexpr int kRing = 256;
};

// Allocates and zeroes the ring (at backend set-up, before any graph capture; idempotent).
void tile_counters_prepare();

// The counter for the next launch on `stream`, or nullptr when the ring does not exist yet and the
// stream is capturing a graph (allocating there is not allowed; the caller deals statically).
uint32_t* tile_counter_next(cudaStream_t stream);

}  // namespace kiln::cuda
