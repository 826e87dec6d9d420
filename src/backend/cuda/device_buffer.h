// Device memory and the few runtime services tests and benchmarks need, exported by kiln_cuda so
// that no other binary links its own copy of the (static) CUDA runtime.
//   DeviceBuffer<T>: a typed, non-copyable, movable cudaMalloc allocation with upload/download.
//   cuda_device_count(), cuda_synchronize(), device_info(): runtime queries.
//   EventTimer: CUDA-event timing of work enqueued on a stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

namespace kiln::cuda {

// 0 when there is no driver or no device (never throws): tests use it to skip.
int cuda_device_count();
void cuda_synchronize();
void stream_synchronize(cudaStream_t stream);

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int64_t l2_bytes = 0;
  int64_t total_mem = 0;
  int64_t smem_optin = 0;
};
DeviceInfo device_info();

// Untyped allocation; DeviceBuffer<T> is the typed face.
class RawDeviceBuffer {
 public:
  RawDeviceBuffer() = default;
  explicit RawDeviceBuffer(size_t bytes);
  ~RawDeviceBuffer();
  RawDeviceBuffer(const RawDeviceBuffer&) = delete;
  RawDeviceBuffer& operator=(const RawDeviceBuffer&) = delete;
  RawDeviceBuffer(RawDeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  RawDeviceBuffer& operator=(RawDeviceBuffer&& o) noexcept;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  // Fills every byte with `value` (0xff makes NaN in fp32 and bf16: the poison tests use).
  void fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : raw_(count * sizeof(T)), count_(count) {}
  explicit DeviceBuffer(std::span<const T> host) : DeviceBuffer(host.size()) { upload(host); }

  T* data() const { return static_cast<T*>(raw_.data()); }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  void upload(std::span<const T> host, size_t offset = 0) { raw_.upload(host.data(), host.size() * sizeof(T), offset * sizeof(T)); }
  void download(std::span<T> host, size_t offset = 0) const { raw_.download(host.data(), host.size() * sizeof(T), offset * sizeof(T)); }
  std::vector<T> to_host() const {
    std::vector<T> h(count_);
    download(h);
    return h;
  }
  void poison() { raw_.fill_bytes(0xff); }
  void zero() { raw_.fill_bytes(0); }

 private:
  RawDeviceBuffer raw_;
  size_t count_ = 0;
};

// Times the work enqueued between start() and stop() on one stream.
class EventTimer {
 public:
  explicit EventTimer(cudaStream_t stream = nullptr);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  void stop();
  float elapsed_ms();  // waits for stop

 private:
  cudaStream_t stream_;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

// Makes `waiter` wait for the work enqueued on `on` so far (an event recorded on `on`): the fork and
// join of work run on two streams at once.
void stream_wait(cudaStream_t waiter, cudaStream_t on);

// A stream owned by the caller (RAII). A high-priority stream's blocks are dispatched ahead of
// those of kernels already queued on normal streams whenever an SM frees up.
class Stream {
 public:
  enum class Priority { normal, high };
  explicit Stream(Priority priority = Priority::normal);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace kiln::cuda
