// The ceilings the kernel lab measures every kernel against, each timed as the kernels are
// (time_ms): the copy kernel's bandwidth over 1 GB and the timing's own floor, and one call's bytes
// copied or only read, the bound of any memory-bound call of that size.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernel_lab.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/stream_hold.h"

namespace kiln::lab {

using namespace kiln::cuda;

double copy_ceiling() {
  const int64_t bytes = 1ll << 30;
  DeviceBuffer<char> a(bytes), b(bytes);
  a.zero();
  double ms = time_ms([&](int) { copy_device(b.data(), a.data(), bytes, nullptr); }, 20, 3);
  double gbs = 2.0 * bytes / ms / 1e6;
  std::printf("copy kernel: %.0f GB/s (bytes read + written): the bandwidth ceiling below\n", gbs);
  g_results.push_back({{"kernel", "copy"}, {"gbs", gbs}});
  // The floor of any timed call: a one-thread kernel that exits at once, timed the same way.
  const double empty_ms = time_ms([&](int) { cuda::hold_stream(0, nullptr); }, 50, 5);
  std::printf("empty kernel: %.2f us a call (the timing's own floor)\n", empty_ms * 1e3);
  g_results.push_back({{"kernel", "empty"}, {"us", empty_ms * 1e3}});
  return gbs;
}

// A copy of one call's traffic: `half` bytes read and `half` written, from and into buffers of
// their own that rotate through more than 4x the L2, so neither side of a call meets the cache
// lines of the last one. What one isolated memory-bound call of this traffic reaches, ramp and
// tail included (the "copy" rows beside the GEMVs).
double copy_traffic_ms(int64_t half) {
  const int copies = int(std::max<int64_t>(2, kRotateBytes / half + 1));
  std::vector<DeviceBuffer<char>> src, dst;
  for (int i = 0; i < copies; ++i) {
    src.emplace_back(size_t(half));
    dst.emplace_back(size_t(half));
  }
  return time_ms(
      [&](int i) { copy_device(dst[size_t(i % copies)].data(), src[size_t(i % copies)].data(), half, nullptr); }, 100);
}

// A read of one call's weight bytes and nothing else (read_device), from buffers rotating through
// more than 4x the L2: the ceiling of a read-only kernel timed as one call, ramp and tail included
// (the "read" rows beside the GEMVs; a GEMV writes almost nothing, a copy writes half its traffic).
double read_traffic_ms(int64_t bytes) {
  const int copies = int(std::max<int64_t>(2, kRotateBytes / bytes + 1));
  std::vector<DeviceBuffer<char>> src;
  for (int i = 0; i < copies; ++i) src.emplace_back(size_t(bytes));
  DeviceBuffer<uint32_t> sink(1);
  return time_ms([&](int i) { read_device(src[size_t(i % copies)].data(), bytes, sink.data(), nullptr); }, 100);
}

}  // namespace kiln::lab
