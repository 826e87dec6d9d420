// `kernel_lab --overlap`: can a many-sequence decode step run its attention beside its GEMMs?
//
// Issue #8's 2048 x 128/128 run spends about half its time in decode steps, and a third of such a
// step (2048 rows at ~192 positions) is the paged decode attention: memory-bound, at the copy rate,
// on every SM, while the GEMMs around it are compute-bound on every SM. If the attention reaches
// the copy rate on a fraction of the SMs, a step split into two micro-batches could run one
// half's attention beside the other half's GEMMs (NanoFlow's idea) and hide most of it. This bench
// measures that bound before any engine work: one half-step GEMM (gate/up, M = 1024) and one
// half-step attention (1024 sequences x 192 positions, shuffled 16-token blocks), each alone, one
// after the other, and at once on two streams with the persistent GEMM's grid capped at S SMs
// (gemm_persistent_set_sm_limit), so the attention's blocks get the other SMs.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernel_lab.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/matmul.h"
#include "paged_kv_pool.h"

namespace kiln::lab {

using namespace kiln::cuda;

namespace {

// Median over `reps` of a region's time on stream s (fn enqueues the region's work, on s or forked
// from it and joined back), after 2 untimed regions.
double region_ms(cudaStream_t s, const std::function<void()>& fn, int reps = 9) {
  for (int i = 0; i < 2; ++i) fn();
  EventTimer t(s);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    t.start();
    fn();
    t.stop();
    ms.push_back(t.elapsed_ms());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

void bench_overlap(double copy_gbs, int sm_count) {
  constexpr int heads = 32, kv_heads = 8, d = 128;
  constexpr int64_t kv_dim = int64_t(kv_heads) * d, hidden = 4096, n_gu = 28672, batch = 1024, len = 192;
  constexpr int64_t cap = 4096;  // the engine plans the attention's split count from its capacity
  // Pairs a region runs back to back: ~20 ms, long enough for the clock to settle at the power cap.
  constexpr int kPairs = 32;
  const ShuffledPagedKv pool(batch, len, kv_dim, d, 9, 11);
  DeviceBuffer<bf16> q(size_t(batch * heads * d)), out(q.size());
  fill_random_bf16(q.data(), int64_t(q.size()), 9, 2, 0, 1.0f, nullptr);
  const std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(len));
  DeviceBuffer<int32_t> dlen(lens);
  DeviceBuffer<float> ws(size_t(decode_workspace_floats(batch, heads, d, cap)));
  const auto wsv = decode_workspace(ws.data(), batch, heads, d, cap);
  DeviceBuffer<bf16> x(size_t(batch * hidden)), w(size_t(n_gu * hidden)), y(size_t(batch * n_gu));
  fill_random_bf16(x.data(), int64_t(x.size()), 10, 0, 0, 1.0f, nullptr);
  fill_random_bf16(w.data(), int64_t(w.size()), 10, 1, 0, 0.02f, nullptr);
  cuda_synchronize();
  Stream s1, s2;
  auto gemm_call = [&](cudaStream_t s) { gemm(x.data(), w.data(), nullptr, y.data(), OutMode::store_bf16, batch, n_gu, hidden, s); };
  auto attn_call = [&](cudaStream_t s) {
    attention_decode(q.data(), pool.layout, dlen.data(), cap, out.data(), wsv, batch, heads, kv_heads, d, s);
  };
  const double bytes = 2.0 * batch * len * kv_dim * 2, flops = 2.0 * batch * n_gu * hidden;

  gemm_persistent_set_sm_limit(0);
  gemm_call(s1.get());
  stream_synchronize(s1.get());
  const std::vector<bf16> y_all = y.to_host();
  const double t_gemm = region_ms(s1.get(), [&] { for (int i = 0; i < kPairs; ++i) gemm_call(s1.get()); }) / kPairs;
  const double t_attn = region_ms(s1.get(), [&] { for (int i = 0; i < kPairs; ++i) attn_call(s1.get()); }) / kPairs;
  const double t_serial = region_ms(s1.get(), [&] {
    for (int i = 0; i < kPairs; ++i) gemm_call(s1.get()), attn_call(s1.get());
  }) / kPairs;
  std::printf("\noverlap: gate_up GEMM M=%lld %lldx%lld beside paged decode attention b=%lld L=%lld (bf16 cache); "
              "ms a pair, medians of 9 regions of %d pairs\n",
              (long long)batch, (long long)n_gu, (long long)hidden, (long long)batch, (long long)len, kPairs);
  std::printf("alone: GEMM %.3f ms (%.0f TFLOP/s), attention %.3f ms (%.0f GB/s); one after the other %.3f ms\n", t_gemm,
              flops / t_gemm / 1e9, t_attn, bytes / t_attn / 1e6, t_serial);
  record("overlap", "gemm alone", "all", t_gemm, 0, flops, copy_gbs, 0);
  record("overlap", "attention alone", "all", t_attn, bytes, 0, copy_gbs, 0);
  record("overlap", "serial", "all", t_serial, bytes, flops, copy_gbs, 0);
  std::printf("%9s %14s %14s %12s\n", "GEMM SMs", "GEMM alone", "both at once", "/ serial");
  for (const int limit : {0, 120, 108, 96, 84, 72, 60}) {
    gemm_persistent_set_sm_limit(limit);
    const double g = region_ms(s1.get(), [&] { for (int i = 0; i < kPairs; ++i) gemm_call(s1.get()); }) / kPairs;
    const double both = region_ms(s1.get(), [&] {
      stream_wait(s2.get(), s1.get());
      for (int i = 0; i < kPairs; ++i) gemm_call(s1.get()), attn_call(s2.get());
      stream_wait(s1.get(), s2.get());
    }) / kPairs;
    stream_synchronize(s1.get());
    // The capped grid computes the same tiles: the same bits.
    const std::vector<bf16> y_cap = y.to_host();
    const bool same = std::memcmp(y_cap.data(), y_all.data(), y_all.size() * sizeof(bf16)) == 0;
    const int sms = limit > 0 ? limit : sm_count;
    std::printf("%9d %11.3f ms %11.3f ms %12.3f%s\n", sms, g, both, both / t_serial, same ? "" : "  OUTPUT DIFFERS");
    char shape[48];
    std::snprintf(shape, sizeof shape, "gemm SMs=%d", sms);
    record("overlap", shape, "gemm", g, 0, flops, copy_gbs, same ? 0 : 1);
    record("overlap", shape, "both", both, bytes, flops, copy_gbs, same ? 0 : 1);
  }
  gemm_persistent_set_sm_limit(0);
}

}  // namespace kiln::lab
