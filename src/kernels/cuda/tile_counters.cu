// tile_counters.h's ring.
#include "kernels/cuda/tile_counters.h"

#include <mutex>

#include "backend/cuda/cuda_check.h"

namespace kiln::cuda {
namespace {

struct Ring {
  std::mutex mu;
  uint32_t* device = nullptr;
  int next = 0;

  void allocate_locked() {
    if (device) return;
    KILN_CUDA_CHECK(cudaMalloc(&device, TileCounters::kRing * sizeof(uint32_t)));
    KILN_CUDA_CHECK(cudaMemset(device, 0, TileCounters::kRing * sizeof(uint32_t)));
    // The memset runs on the legacy stream; non-blocking streams do not wait for it.
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

Ring& ring() {
  static Ring r;
  return r;
}

}  // namespace

void tile_counters_prepare() {
  Ring& r = ring();
  std::lock_guard lock(r.mu);
  r.allocate_locked();
}

uint32_t* tile_counter_next(cudaStream_t stream) {
  Ring& r = ring();
  std::lock_guard lock(r.mu);
  if (!r.device) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    if (status != cudaStreamCaptureStatusNone) return nullptr;
    r.allocate_locked();
  }
  uint32_t* c = r.device + r.next;
  r.next = (r.next + 1) % TileCounters::kRing;
  return c;
}

}  // namespace kiln::cuda
