// Two disjoint SM partitions of the GPU, each with its own stream (used by kernel_lab --overlap):
// CUDA green contexts (driver 12.4+), reached through cudaGetDriverEntryPointByVersion so kiln
// links no libcuda. A kernel launched on one partition's stream runs only on that partition's SMs,
// whatever its grid, so two kernels at once share the GPU by SMs rather than by the block
// dispatcher's launch order.
// The green contexts share the primary context's memory: buffers from cudaMalloc work on both.
// It lives in kiln_cuda, not in the lab, because only kiln_cuda links the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include <string>

struct CUgreenCtx_st;  // cuda.h's green-context handle, kept out of this header

namespace kiln::cuda {

class SmSplit {
 public:
  // Splits the SMs into a first partition of at least `first_sms` (the driver rounds up to its
  // granularity: 8 on Hopper) and the rest. ok() is false, and why() says why, where the driver
  // has no green contexts.
  explicit SmSplit(int first_sms);
  ~SmSplit();
  SmSplit(const SmSplit&) = delete;
  SmSplit& operator=(const SmSplit&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  int first_sms() const { return first_sms_; }
  int rest_sms() const { return rest_sms_; }
  cudaStream_t first() const { return first_stream_; }
  cudaStream_t rest() const { return rest_stream_; }

 private:
  struct Driver;
  bool ok_ = false;
  std::string why_;
  int first_sms_ = 0, rest_sms_ = 0;
  CUgreenCtx_st* first_ctx_ = nullptr;
  CUgreenCtx_st* rest_ctx_ = nullptr;
  cudaStream_t first_stream_ = nullptr, rest_stream_ = nullptr;
};

}  // namespace kiln::cuda
