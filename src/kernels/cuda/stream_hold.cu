#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/stream_hold.h"

namespace kiln::cuda {
namespace {

__global__ void hold_kernel(uint64_t nanoseconds) {
  if (nanoseconds == 0) return;  // an empty kernel (the kernel lab times the launch floor with it)
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

void hold_stream(int64_t microseconds, cudaStream_t stream) {
  hold_kernel<<<1, 1, 0, stream>>>(uint64_t(microseconds) * 1000);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
