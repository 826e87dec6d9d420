// The kernel lab's probe of what one kernel-to-kernel handoff costs (kernel_lab --handoff): a chain
// of identical kernels, each block busy for a fixed number of cycles after it may start, handing
// over to the next kernel in one of three ways. The time per kernel minus the busy time is the cost
// of a boundary: what a batch-1 decode step, ~7 kernels a layer, pays ~220 times a token.
//   plain: launched without PDL; the next kernel starts once this one has completed.
//   pdl:   kiln's way (pdl.cuh): launched with PDL, griddepcontrol.wait, then the dependent released.
//   flag:  launched with PDL and released the same way, but a kernel waits for the one before it
//          by polling a counter that each of that kernel's blocks increments (release / acquire at
//          GPU scope) when its work is done, instead of griddepcontrol.wait's grid completion.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

enum class Handoff { plain, pdl, flag };

struct HandoffTiming {
  double us_per_kernel = 0;  // chain time / kernels (CUDA events, one chain)
  int stale_reads = 0;       // kernels that read their predecessor's value before it was written (must be 0)
};

// One chain of `kernels` launches of `blocks` x `threads`, each block busy `busy_cycles` SM cycles.
HandoffTiming handoff_chain(Handoff mode, int kernels, int blocks, int threads, int64_t busy_cycles,
                            cudaStream_t stream);

}  // namespace kiln::cuda
