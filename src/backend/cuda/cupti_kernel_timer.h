// Per-op GPU kernel times from CUPTI's activity records: the start and end timestamps the GPU
// itself writes for every kernel, so timing adds nothing between kernels.
//
// Why not CUDA events: an event record between every two launches costs ~2 us of GPU time each, and
// a decode step of ~300 launches measured +17% over its untimed length (BENCHMARKS.md, session 2).
// CUPTI's records carry the same kernels' durations without touching the stream.
//
// How kernels are matched to kiln's ops: around each op's launches the timer pushes an external
// correlation id (the op's index in the step); CUPTI pairs that id with the correlation id of every
// runtime/driver API call made inside, and each kernel record carries its launch's correlation id.
//
// libcupti is loaded with dlopen when profiling starts, so kiln needs no CUPTI to run; open()
// returns nullptr with the reason when it is absent (kiln profile then falls back to events).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::cuda {

class CuptiKernelTimer {
 public:
  // What an op cost the GPU: its kernels' run time plus the idle time just before each of them
  // (the launch gap: the GPU waiting for this kernel after finishing the previous one). Charging
  // the gap to the kernel after it is what events between launches measure, without the events'
  // own cost; the per-op times of a step then add up to the span from its first kernel's start to
  // its last one's end. idle_ms says how much of ms was gap.
  struct OpTime {
    double ms = 0;
    double idle_ms = 0;
    int64_t kernels = 0;  // kernels the op launched
  };

  // The process-wide timer (CUPTI allows one activity subscriber), or nullptr and *why_not.
  static CuptiKernelTimer* open(std::string* why_not);

  // Starts recording kernel activity; ops are numbered from 0 by the caller.
  void start();
  void begin_op(uint64_t op);
  void end_op();
  // One kernel as the GPU ran it (for a timeline): its op, its name as CUPTI reports it (mangled),
  // and its start and end in ns on the GPU's clock.
  struct Span {
    uint64_t op = 0;
    std::string kernel;
    uint64_t start_ns = 0, end_ns = 0;
  };
  // Flushes CUPTI's buffers (after the stream is synchronized) and returns the time of ops
  // 0 .. n_ops - 1 recorded since start(); stops recording. spans (optional): every matched
  // kernel, in start order.
  std::vector<OpTime> stop(size_t n_ops, std::vector<Span>* spans = nullptr);
  // Kernels seen since start() that ran outside any op (e.g. a stream hold): diagnostics.
  int64_t unmatched_kernels() const { return unmatched_; }

  struct Api;  // the dlopen'ed CUPTI entry points

 private:
  explicit CuptiKernelTimer(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
  int64_t unmatched_ = 0;
};

}  // namespace kiln::cuda
