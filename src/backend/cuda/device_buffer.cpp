#include "backend/cuda/device_buffer.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "core/check.h"

namespace kiln::cuda {

[[noreturn]] void fail_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  // Clear a non-sticky error so the next call does not report it again.
  (void)cudaGetLastError();
  KILN_FAIL(cuda, "CUDA error {} ({}) in `{}` at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), expr, file,
            line);
}

[[noreturn]] void fail_cublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  KILN_FAIL(cuda, "cuBLAS error {} ({}) in `{}` at {}:{}", cublasGetStatusName(st), cublasGetStatusString(st), expr,
            file, line);
}

[[noreturn]] void fail_invalid(const char* what, const char* file, int line) {
  KILN_FAIL(invalid_argument, "{} ({}:{})", what, file, line);
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void cuda_synchronize() { KILN_CUDA_CHECK(cudaDeviceSynchronize()); }
void stream_synchronize(cudaStream_t stream) { KILN_CUDA_CHECK(cudaStreamSynchronize(stream)); }

DeviceInfo device_info() {
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return DeviceInfo{p.name, p.multiProcessorCount, p.major, p.minor, p.l2CacheSize, int64_t(p.totalGlobalMem),
                    int64_t(p.sharedMemPerBlockOptin)};
}

RawDeviceBuffer::RawDeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) KILN_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

RawDeviceBuffer::~RawDeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // no throw from a destructor; a failure here leaves nothing to fix
}

RawDeviceBuffer& RawDeviceBuffer::operator=(RawDeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void RawDeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  KILN_CHECK(offset + bytes <= bytes_, invalid_argument, "upload of {} bytes at {} overflows a {}-byte buffer", bytes,
             offset, bytes_);
  if (bytes) KILN_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
}

void RawDeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  KILN_CHECK(offset + bytes <= bytes_, invalid_argument, "download of {} bytes at {} overflows a {}-byte buffer",
             bytes, offset, bytes_);
  if (bytes) KILN_CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void RawDeviceBuffer::fill_bytes(int value) {
  if (bytes_) KILN_CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
}

EventTimer::EventTimer(cudaStream_t stream) : stream_(stream) {
  KILN_CUDA_CHECK(cudaEventCreate(&a_));
  KILN_CUDA_CHECK(cudaEventCreate(&b_));
}
EventTimer::~EventTimer() {
  cudaEventDestroy(a_);
  cudaEventDestroy(b_);
}
void EventTimer::start() { KILN_CUDA_CHECK(cudaEventRecord(a_, stream_)); }
void EventTimer::stop() { KILN_CUDA_CHECK(cudaEventRecord(b_, stream_)); }
float EventTimer::elapsed_ms() {
  KILN_CUDA_CHECK(cudaEventSynchronize(b_));
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
  return ms;
}

void stream_wait(cudaStream_t waiter, cudaStream_t on) {
  cudaEvent_t e = nullptr;
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventRecord(e, on));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(waiter, e, 0));
  KILN_CUDA_CHECK(cudaEventDestroy(e));  // released once the wait has happened
}

Stream::Stream(Priority priority) {
  int least = 0, greatest = 0;  // CUDA's priorities: lower numbers are higher; least is the default
  KILN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority == Priority::high ? greatest : least));
}
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}

}  // namespace kiln::cuda
