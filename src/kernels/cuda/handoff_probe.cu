// kernel_lab --handoff: handoff_probe.h.
#include "kernels/cuda/handoff_probe.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/stream_hold.h"

namespace kiln::cuda {
namespace {

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Kernel i of the chain. Its block 0 writes value[i] = i + 1 once its work is done, and reads
// value[i - 1] once its wait returns: a stale read means the handoff let it start too early.
template <Handoff kMode>
__global__ void handoff_kernel(int i, unsigned* arrived, int* value, int* stale, int64_t busy_cycles) {
  if (i > 0) {
    if constexpr (kMode == Handoff::pdl) pdl_wait();
    if constexpr (kMode == Handoff::flag) {
      if (threadIdx.x == 0)
        while (ld_acquire_gpu(arrived + i - 1) < gridDim.x) {
        }
      __syncthreads();
    }
  }
  if constexpr (kMode != Handoff::plain) pdl_launch_dependents();  // after the wait, as pdl.cuh's contract
  if (i > 0 && blockIdx.x == 0 && threadIdx.x == 0 && *reinterpret_cast<volatile int*>(value + i - 1) != i)
    atomicAdd(stale, 1);
  const int64_t t0 = clock64();
  while (clock64() - t0 < busy_cycles) {
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) value[i] = i + 1;
    if constexpr (kMode == Handoff::flag) {
      __threadfence();  // this block's writes before its arrival
      atomicAdd(arrived + i, 1u);
    }
  }
}

}  // namespace

HandoffTiming handoff_chain(Handoff mode, int kernels, int blocks, int threads, int64_t busy_cycles,
                            cudaStream_t stream) {
  DeviceBuffer<unsigned> arrived{size_t(kernels)};
  DeviceBuffer<int> value{size_t(kernels)}, stale{1};
  KILN_CUDA_CHECK(cudaMemsetAsync(arrived.data(), 0, size_t(kernels) * sizeof(unsigned), stream));
  KILN_CUDA_CHECK(cudaMemsetAsync(value.data(), 0, size_t(kernels) * sizeof(int), stream));
  KILN_CUDA_CHECK(cudaMemsetAsync(stale.data(), 0, sizeof(int), stream));
  cudaEvent_t a, b;
  KILN_CUDA_CHECK(cudaEventCreate(&a));
  KILN_CUDA_CHECK(cudaEventCreate(&b));
  // Hold the GPU while the host queues the chain, so the launches are timed, not the host's rate
  // of issuing them (kiln's decode step runs from a CUDA graph).
  hold_stream(2000 + 10 * int64_t(kernels), stream);
  KILN_CUDA_CHECK(cudaEventRecord(a, stream));
  auto* kernel = mode == Handoff::plain ? handoff_kernel<Handoff::plain>
                 : mode == Handoff::pdl ? handoff_kernel<Handoff::pdl>
                                        : handoff_kernel<Handoff::flag>;
  for (int i = 0; i < kernels; ++i) {
    launch_maybe_pdl(mode != Handoff::plain, kernel, dim3(unsigned(blocks)), dim3(unsigned(threads)), 0, stream, i,
                     arrived.data(), value.data(), stale.data(), busy_cycles);
    KILN_CUDA_CHECK_LAUNCH();
  }
  KILN_CUDA_CHECK(cudaEventRecord(b, stream));
  KILN_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  KILN_CUDA_CHECK(cudaEventDestroy(a));
  KILN_CUDA_CHECK(cudaEventDestroy(b));
  HandoffTiming t;
  t.us_per_kernel = double(ms) * 1000.0 / kernels;
  KILN_CUDA_CHECK(cudaMemcpy(&t.stale_reads, stale.data(), sizeof(int), cudaMemcpyDeviceToHost));
  return t;
}

}  // namespace kiln::cuda
