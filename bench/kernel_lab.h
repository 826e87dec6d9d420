// What the kernel lab's benches share (kernel_lab.cpp, kernel_lab_attention.cpp): the run's
// flags, CUDA-event timing (median after warm-up), bf16 readback, relative error, and record(),
// which prints one result line and appends it to the --json document.
//
// Timing of one call (time_ms): by default the stream is held by a short spin kernel while the
// host enqueues the start event, the call and the stop event, so the events bracket the kernels as
// the GPU runs them back to back (as in a CUDA graph), not the host's launch latency -- nvbench's
// "blocking kernel" method. Through session 4 the events bracketed a launch from an idle GPU, which
// added 4-8 us to every call (the intercept of time against bytes in the GEMV tables); --unheld
// times that way again.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/cublas_ref.h"
#include "backend/cuda/device_buffer.h"
#include "core/dtype.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/stream_hold.h"

namespace kiln::lab {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::EventTimer;

constexpr double kPeakTflops = 700.0;  // bf16 dense, H200 (cuBLAS reaches 675-790 on 8192^3)
constexpr int64_t kRotateBytes = 256ll << 20;  // > 4x the L2

inline bool g_quick = false;
inline bool g_held = true;  // time_ms holds the stream while it enqueues each call (see above)
constexpr int64_t kHoldMicroseconds = 50;  // longer than the host needs to enqueue events + a call
inline int g_gemm_first_version = 1;  // --gemm: 4 (the mma.sync v1-v3 were measured in earlier runs)
inline bool g_gemm_default_only = false;  // --default-only: the GEMM timings of the default choice and cuBLAS only
inline double g_sustain_seconds = 0;  // --sustain S: also each GEMM and cuBLAS back to back for ~S s (at the power cap)
inline bool g_decode_only = false;    // --decode: the quantized products at M = 1 and 16 only (no prefill)
inline nlohmann::json g_results = nlohmann::json::array();

// Median of `reps` timings of fn(rep) after `warmup` untimed calls, the events on `stream` (fn's work
// runs there, or is forked from it and joined back).
inline double time_ms(const std::function<void(int)>& fn, int reps = 50, int warmup = 5, cudaStream_t stream = nullptr) {
  if (g_quick) reps = std::min(reps, 10);
  for (int i = 0; i < warmup; ++i) fn(i);
  EventTimer t(stream);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    if (g_held) cuda::hold_stream(kHoldMicroseconds, stream);
    t.start();
    fn(i);
    t.stop();
    ms.push_back(t.elapsed_ms());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Per-call time of calls run "in sequence": kSeq calls back to back between the events, call(c)
// for c = kSeq * rep + 0 .. kSeq - 1 (so `c % copies` walks the rotating inputs), the median over
// `reps` of the total divided by kSeq. This is how a decode step runs its GEMVs: under PDL each
// call's blocks start their weight loads while the previous call drains.
constexpr int kSeq = 8;
inline double time_in_sequence(const std::function<void(int)>& call, int reps) {
  return time_ms([&](int i) {
    for (int j = 0; j < kSeq; ++j) call(kSeq * i + j);
  }, reps) / kSeq;
}

inline std::vector<float> to_float(const DeviceBuffer<bf16>& d) {
  std::vector<bf16> raw = d.to_host();
  std::vector<float> f(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, &raw[i], 2);
    f[i] = bf16_to_f32(b);
  }
  return f;
}

inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline void record(const std::string& kernel, const std::string& shape, const std::string& version, double ms, double bytes,
            double flops, double ceiling_gbs, double err) {
  double gbs = bytes / ms / 1e6, tflops = flops / ms / 1e9;
  std::printf("%-18s %-26s %-8s %9.2f us %8.0f GB/s (%5.1f%% copy) %7.1f TFLOP/s (%5.1f%% peak)  err %.1e\n",
              kernel.c_str(), shape.c_str(), version.c_str(), ms * 1e3, gbs, 100 * gbs / ceiling_gbs, tflops,
              100 * tflops / kPeakTflops, err);
  std::fflush(stdout);
  g_results.push_back({{"kernel", kernel}, {"shape", shape}, {"version", version}, {"us", ms * 1e3}, {"gbs", gbs},
                       {"tflops", tflops}, {"pct_copy", 100 * gbs / ceiling_gbs}, {"pct_peak", 100 * tflops / kPeakTflops},
                       {"rel_err_vs_cublas", err}, {"floor_us", bytes / ceiling_gbs / 1e3}});
}

// A projection's weight shape (N x K: output rows by input width) and a result's label for it,
// "gate_up M=16 28672x4096".
struct MatShape {
  const char* name;
  int64_t n, k;
};
// "v3" for version 3. (Appended, not "v" + std::to_string(v): GCC 12 flags that operator+'s
// inlined insert with a false -Wrestrict warning.)
inline std::string version_label(int version) {
  std::string label(1, 'v');
  label += std::to_string(version);
  return label;
}

inline std::string shape_name(const MatShape& s, int64_t m) {
  char shape[64];
  std::snprintf(shape, sizeof shape, "%s M=%lld %lldx%lld", s.name, (long long)m, (long long)s.n, (long long)s.k);
  return shape;
}

// The ceilings (kernel_lab_ceilings.cpp): the copy kernel's GB/s over 1 GB (printed with the timing's
// floor, an empty kernel); one call's traffic copied (`half` bytes read, `half` written) or only read,
// ms, from buffers rotating through more than 4x the L2.
double copy_ceiling();
double copy_traffic_ms(int64_t half);
double read_traffic_ms(int64_t bytes);

// The attention benches (kernel_lab_attention.cpp).
void probe_wgmma_prefill();
void bench_attention(double copy_gbs);
void bench_decode_batched(double copy_gbs);  // also part of bench_attention
// The batched paged decode over an engine-shaped pool of 32 layers (kernel_lab_kv_pool.cpp, --kv-pool).
void bench_decode_kv_pool(double copy_gbs);
// The fp8 prefill GEMMs (kernel_lab_fp8.cpp, --fp8-gemm) at each M against cuBLASLt fp8 and bf16.
void bench_fp8_gemm(double copy_gbs, cuda::CublasGemm& cublas, const std::vector<MatShape>& shapes,
                    const std::vector<int64_t>& ms);
// What one kernel boundary costs, plain / PDL / counter handoffs (kernel_lab_handoff.cpp, --handoff).
void bench_handoff(int sm_count);
// kernel_lab_overlap.cpp: a half decode step's gate/up GEMM and attention, alone, serial and at once.
void bench_overlap(double copy_gbs, int sm_count);

}  // namespace kiln::lab
