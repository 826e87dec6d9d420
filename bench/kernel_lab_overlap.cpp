// `kernel_lab --overlap`: can a many-sequence decode step run its attention beside its GEMMs?
//
// Issue #8's 2048 x 128/128 run spends about half its time in decode steps, and a third of such a
// step (2048 rows at ~192 positions) is the paged decode attention: memory-bound, at the copy rate,
// on every SM, while the GEMMs around it are compute-bound on every SM. If the attention reaches
// the copy rate on a fraction of the SMs, a step split into two micro-batches could run one
// half's attention beside the other half's GEMMs (NanoFlow's idea) and hide most of it. This bench
// measures that bound before any engine work: one half-step GEMM (gate/up, or down adding into the
// fp32 residual; M = 1024) and one half-step attention (1024 sequences x 192 positions, shuffled
// 16-token blocks, a bf16 or an fp8 cache), each alone, one after the other, and at once on two
// streams with the persistent GEMM's grid capped at S SMs (gemm_persistent_set_sm_limit), so the
// attention's blocks get the other SMs. Each cap runs twice: the GEMM on a normal-priority stream,
// then on a high-priority one, whose blocks the dispatcher serves ahead of queued attention blocks.
// Session 32 (H100, H200): at once = 0.97-1.02x serial on the whole grid at either priority, and
// worse at every cap (to 1.35x: the GEMM is linear in its SMs). Last, the SMs split in two by green
// contexts (backend/cuda/sm_partition.h): the attention alone on k SMs, the GEMM alone on the other
// 132 - k, and both at once, each kept to its own SMs. The attention's rate on k SMs is the
// quantity the idea stands on: the pair can beat the serial time only if the attention on a
// fraction of the SMs runs faster than that fraction of its whole-GPU rate. Session 33 (H100): it
// draws 31-38 GB/s an SM on 16-80 SMs against 22 on all 132, and the best split takes 0.948x the
// serial pair (gate/up, 48 SMs): at most ~1.3% of issue #8's run, so the idea is closed and this
// bench is no longer part of scripts/gpu_suite.sh (performance/batching-offline-run.md, session 33).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/sm_partition.h"
#include "kernel_lab.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/matmul.h"
#include "paged_kv_pool.h"

namespace kiln::lab {

using namespace kiln::cuda;

namespace {

// Pairs a region runs back to back: ~20 ms, long enough for the clock to settle at the power cap.
constexpr int kPairs = 32;

// A region's time on stream s, ms: the median of 9 after 2 untimed.
double region_ms(cudaStream_t s, const std::function<void()>& fn) {
  return time_ms([&](int) { fn(); }, 9, 2, s);
}

// A region's wall time, ms, the median of 9 after 2: the streams of two green contexts share no
// events simply, so the host brackets the region, synchronizing every stream before and after (a
// region is 5-20 ms; the synchronizes cost ~10 us).
double wall_region_ms(std::initializer_list<cudaStream_t> streams, const std::function<void()>& fn) {
  std::vector<double> ms;
  for (int rep = 0; rep < 11; ++rep) {
    for (cudaStream_t s : streams) stream_synchronize(s);
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    for (cudaStream_t s : streams) stream_synchronize(s);
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The pair with the SMs split by green contexts: the attention on k SMs, the GEMM (its persistent
// grid capped to match) on the rest.
void partition_table(const std::string& tag, double copy_gbs, cudaStream_t whole,
                     const std::function<void(cudaStream_t)>& gemm_call,
                     const std::function<void(cudaStream_t)>& attn_call, double flops, double bytes) {
  const double serial = wall_region_ms({whole}, [&] {
    for (int i = 0; i < kPairs; ++i) gemm_call(whole), attn_call(whole);
  }) / kPairs;
  const double attn_all = wall_region_ms({whole}, [&] { for (int i = 0; i < kPairs; ++i) attn_call(whole); }) / kPairs;
  std::printf("SMs split (green contexts; host-timed: one after the other on all SMs %.3f ms, the attention %.3f ms)\n",
              serial, attn_all);
  std::printf("%9s %14s %10s %9s %14s %14s %12s\n", "attn SMs", "attn alone", "GB/s", "GEMM SMs", "GEMM alone",
              "both at once", "/ serial");
  for (const int k : {16, 24, 32, 48, 64, 80}) {
    const SmSplit split(k);
    if (!split.ok()) {
      std::printf("no SM split: %s\n", split.why().c_str());
      return;
    }
    const cudaStream_t sa = split.first(), sg = split.rest();
    gemm_persistent_set_sm_limit(split.rest_sms());
    const double a = wall_region_ms({sa}, [&] { for (int i = 0; i < kPairs; ++i) attn_call(sa); }) / kPairs;
    const double g = wall_region_ms({sg}, [&] { for (int i = 0; i < kPairs; ++i) gemm_call(sg); }) / kPairs;
    const double both = wall_region_ms({sa, sg}, [&] {
      for (int i = 0; i < kPairs; ++i) gemm_call(sg), attn_call(sa);
    }) / kPairs;
    std::printf("%9d %11.3f ms %10.0f %9d %11.3f ms %11.3f ms %12.3f\n", split.first_sms(), a, bytes / a / 1e6,
                split.rest_sms(), g, both, both / serial);
    const std::string shape = tag + ", attention SMs=" + std::to_string(split.first_sms());
    record("overlap", shape, "attention alone", a, bytes, 0, copy_gbs, 0);
    record("overlap", shape, "gemm alone", g, 0, flops, copy_gbs, 0);
    record("overlap", shape, "both", both, bytes, flops, copy_gbs, 0);
  }
  gemm_persistent_set_sm_limit(0);
}

// One GEMM beside one attention: alone, serial, and at once with the GEMM capped at each S.
void overlap_table(const char* label, double copy_gbs, int sm_count, Stream& s1, Stream& s2, Stream& s_high,
                   const std::function<void(cudaStream_t)>& gemm_call, const std::function<void(cudaStream_t)>& attn_call,
                   const std::function<std::vector<float>()>& gemm_output, double flops, double bytes) {
  gemm_persistent_set_sm_limit(0);
  gemm_call(s1.get());
  stream_synchronize(s1.get());
  const std::vector<float> y_all = gemm_output();
  const double t_gemm = region_ms(s1.get(), [&] { for (int i = 0; i < kPairs; ++i) gemm_call(s1.get()); }) / kPairs;
  const double t_attn = region_ms(s1.get(), [&] { for (int i = 0; i < kPairs; ++i) attn_call(s1.get()); }) / kPairs;
  const double t_serial = region_ms(s1.get(), [&] {
    for (int i = 0; i < kPairs; ++i) gemm_call(s1.get()), attn_call(s1.get());
  }) / kPairs;
  std::printf("\noverlap, %s; ms a pair, medians of 9 regions of %d pairs\n", label, kPairs);
  std::printf("alone: GEMM %.3f ms (%.0f TFLOP/s), attention %.3f ms (%.0f GB/s); one after the other %.3f ms\n", t_gemm,
              flops / t_gemm / 1e9, t_attn, bytes / t_attn / 1e6, t_serial);
  const std::string tag(label);
  record("overlap", tag + ", gemm alone", "all", t_gemm, 0, flops, copy_gbs, 0);
  record("overlap", tag + ", attention alone", "all", t_attn, bytes, 0, copy_gbs, 0);
  record("overlap", tag + ", serial", "all", t_serial, bytes, flops, copy_gbs, 0);
  std::printf("%9s %9s %14s %14s %12s\n", "GEMM SMs", "priority", "GEMM alone", "both at once", "/ serial");
  for (const int limit : {0, 120, 108, 96, 84, 72, 60}) {
    for (Stream* gs : {&s1, &s_high}) {
      const cudaStream_t g_s = gs->get();
      const char* priority = gs == &s1 ? "normal" : "high";
      gemm_persistent_set_sm_limit(limit);
      const double g = region_ms(g_s, [&] { for (int i = 0; i < kPairs; ++i) gemm_call(g_s); }) / kPairs;
      const double both = region_ms(g_s, [&] {
        stream_wait(s2.get(), g_s);
        for (int i = 0; i < kPairs; ++i) gemm_call(g_s), attn_call(s2.get());
        stream_wait(g_s, s2.get());
      }) / kPairs;
      stream_synchronize(g_s);
      // The capped grid computes the same tiles: the same bits (down adds into its output every call,
      // so only the store's output is compared).
      const std::vector<float> y_cap = gemm_output();
      const bool same = y_cap.empty() || std::memcmp(y_cap.data(), y_all.data(), y_all.size() * sizeof(float)) == 0;
      const int sms = limit > 0 ? limit : sm_count;
      std::printf("%9d %9s %11.3f ms %11.3f ms %12.3f%s\n", sms, priority, g, both, both / t_serial,
                  same ? "" : "  OUTPUT DIFFERS");
      const std::string shape = tag + ", gemm SMs=" + std::to_string(sms) + ", " + priority + " priority";
      record("overlap", shape, "gemm", g, 0, flops, copy_gbs, same ? 0 : 1);
      record("overlap", shape, "both", both, bytes, flops, copy_gbs, same ? 0 : 1);
    }
  }
  gemm_persistent_set_sm_limit(0);
}

}  // namespace

void bench_overlap(double copy_gbs, int sm_count) {
  constexpr int heads = 32, kv_heads = 8, d = 128;
  constexpr int64_t kv_dim = int64_t(kv_heads) * d, hidden = 4096, inter = 14336, batch = 1024, len = 192;
  constexpr int64_t cap = 4096;  // the engine plans the attention's split count from its capacity
  const ShuffledPagedKv pool(batch, len, kv_dim, d, 9, 11);
  const QuantizedPagedKv pool8(pool, KvQuant::fp8, kv_heads, d);
  DeviceBuffer<bf16> q(size_t(batch * heads * d)), out(q.size());
  fill_random_bf16(q.data(), int64_t(q.size()), 9, 2, 0, 1.0f, nullptr);
  const std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(len));
  DeviceBuffer<int32_t> dlen(lens);
  DeviceBuffer<float> ws(size_t(decode_workspace_floats(batch, heads, d, cap)));
  const auto wsv = decode_workspace(ws.data(), batch, heads, d, cap);
  // gate/up (2 x inter rows over hidden, bf16 out) and down (hidden rows over inter, added into fp32).
  DeviceBuffer<bf16> x(size_t(batch * inter)), w_gu(size_t(2 * inter * hidden)), w_down(size_t(hidden * inter));
  DeviceBuffer<bf16> y_gu(size_t(batch * 2 * inter));
  DeviceBuffer<float> y_down(size_t(batch * hidden));
  fill_random_bf16(x.data(), int64_t(x.size()), 10, 0, 0, 1.0f, nullptr);
  fill_random_bf16(w_gu.data(), int64_t(w_gu.size()), 10, 1, 0, 0.02f, nullptr);
  fill_random_bf16(w_down.data(), int64_t(w_down.size()), 10, 2, 0, 0.02f, nullptr);
  y_down.zero();
  cuda_synchronize();
  Stream s1, s2, s_high(Stream::Priority::high);
  auto gate_up = [&](cudaStream_t s) {
    gemm(x.data(), w_gu.data(), nullptr, y_gu.data(), OutMode::store_bf16, batch, 2 * inter, hidden, s);
  };
  auto down = [&](cudaStream_t s) {
    gemm(x.data(), w_down.data(), nullptr, y_down.data(), OutMode::add_f32, batch, hidden, inter, s);
  };
  auto gate_up_out = [&] { return to_float(y_gu); };
  auto no_out = [] { return std::vector<float>(); };
  auto attn_bf16 = [&](cudaStream_t s) {
    attention_decode(q.data(), pool.layout, dlen.data(), cap, out.data(), wsv, batch, heads, kv_heads, d, s);
  };
  auto attn_fp8 = [&](cudaStream_t s) {
    attention_decode_q8_version(0, q.data(), pool8.layout, dlen.data(), cap, out.data(), wsv, batch, heads, kv_heads, d, s);
  };
  const double bytes16 = 2.0 * batch * len * kv_dim * 2, bytes8 = 2.0 * batch * len * (kv_dim + kv_heads * 4);
  const double flops_gu = 2.0 * batch * 2 * inter * hidden, flops_down = 2.0 * batch * hidden * inter;
  struct Pair {
    const char* label;
    std::function<void(cudaStream_t)> gemm, attn;
    std::function<std::vector<float>()> out;
    double flops, bytes;
  };
  const Pair pairs[] = {
      {"gate_up M=1024 28672x4096 + decode b=1024 L=192 bf16", gate_up, attn_bf16, gate_up_out, flops_gu, bytes16},
      {"down M=1024 4096x14336 (add) + decode b=1024 L=192 bf16", down, attn_bf16, no_out, flops_down, bytes16},
      {"gate_up M=1024 28672x4096 + decode b=1024 L=192 fp8", gate_up, attn_fp8, gate_up_out, flops_gu, bytes8},
  };
  for (const Pair& p : pairs)
    overlap_table(p.label, copy_gbs, sm_count, s1, s2, s_high, p.gemm, p.attn, p.out, p.flops, p.bytes);
  // The SM splits last, so that a driver or runtime that refuses green-context streams costs only
  // these tables.
  for (const Pair& p : pairs) {
    std::printf("\noverlap, %s\n", p.label);
    try {
      partition_table(p.label, copy_gbs, s1.get(), p.gemm, p.attn, p.flops, p.bytes);
    } catch (const std::exception& e) {
      gemm_persistent_set_sm_limit(0);
      std::printf("SM split failed: %s\n", e.what());
      return;
    }
  }
}

}  // namespace kiln::lab
