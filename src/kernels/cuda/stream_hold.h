// Profiling aid: a one-thread kernel that keeps the stream busy for a fixed time, so that while
// it runs the host enqueues a whole step's launches (and their timing events) ahead of the GPU.
// The kernels then run back to back as they do from a CUDA graph, and per-kernel event times
// measure kernels, not the host's launch gaps. Bounded by time, so it can never deadlock.
#pragma once

#include "kernels/cuda/common.h"

namespace kiln::cuda {

// microseconds = 0: a kernel that exits at once.
void hold_stream(int64_t microseconds, cudaStream_t stream);

}  // namespace kiln::cuda
