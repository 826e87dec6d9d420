// kernel_lab: every kernel on the Llama-3-8B shapes, validated against cuBLAS (matrix products),
// then timed with CUDA events: warm-up, median of many repetitions, inputs rotated through more
// than the 60 MB L2. Prints achieved GB/s or TFLOP/s next to the ceilings measured in the same
// run (a 16-byte copy kernel) or assumed (kPeakTflops), and writes everything to --json PATH.
//   kernel_lab [--json PATH] [--quick] [--skinny] [--attention] [--quant] [--decode] [--gemv] [--gemm]
//   (--skinny: only the batched-decode GEMMs, M = 32..256; --attention: only the attention kernels;
//    --quant: only the quantized products, int8 / int4 / fp8, next to bf16 and cuBLAS; --decode: those
//    at M = 1 and 16 only; --gemv: only the bf16 decode GEMVs, M = 1..16, every version;
//    --gemm: only the batched-decode GEMMs at M = 64..256 and the prefill GEMM versions 4.. at
//    M = 512 / 2048 / 4096, with a summary table last)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/cublas_ref.h"
#include "backend/cuda/device_buffer.h"
#include "core/dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "kernels/cuda/random_fill.h"
#include "profile/cost_model.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

constexpr double kPeakTflops = 700.0;  // bf16 dense, H200 (cuBLAS reaches 675-790 on 8192^3)
constexpr int64_t kRotateBytes = 256ll << 20;  // > 4x the L2

bool g_quick = false;
int g_gemm_first_version = 1;  // --gemm: 4 (the mma.sync v1-v3 were measured in earlier runs)
bool g_decode_only = false;    // --decode: the quantized products at M = 1 and 16 only (no prefill)
nlohmann::json g_results = nlohmann::json::array();

// Median of `reps` timings of fn(rep) after `warmup` untimed calls.
double time_ms(const std::function<void(int)>& fn, int reps = 50, int warmup = 5) {
  if (g_quick) reps = std::min(reps, 10);
  for (int i = 0; i < warmup; ++i) fn(i);
  EventTimer t;
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    t.start();
    fn(i);
    t.stop();
    ms.push_back(t.elapsed_ms());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<float> to_float(const DeviceBuffer<bf16>& d) {
  std::vector<bf16> raw = d.to_host();
  std::vector<float> f(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, &raw[i], 2);
    f[i] = bf16_to_f32(b);
  }
  return f;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void record(const std::string& kernel, const std::string& shape, const std::string& version, double ms, double bytes,
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

double copy_ceiling() {
  const int64_t bytes = 1ll << 30;
  DeviceBuffer<char> a(bytes), b(bytes);
  a.zero();
  double ms = time_ms([&](int) { copy_device(b.data(), a.data(), bytes, nullptr); }, 20, 3);
  double gbs = 2.0 * bytes / ms / 1e6;
  std::printf("copy kernel: %.0f GB/s (bytes read + written): the bandwidth ceiling below\n", gbs);
  g_results.push_back({{"kernel", "copy"}, {"gbs", gbs}});
  return gbs;
}

struct MatShape {
  const char* name;
  int64_t n, k;
};
const MatShape kShapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096},
                            {"down", 4096, 14336}, {"lm_head", 128256, 4096}};

// Copies of a random (N, K) bf16 weight, enough that cycling through them reads > 4x the L2 (so
// every timed call streams its weight from DRAM); time_ms's loop takes copy i % size().
std::vector<DeviceBuffer<bf16>> rotating_weights(int64_t wsize) {
  const int copies = int(std::max<int64_t>(1, kRotateBytes / (wsize * 2) + 1));
  std::vector<DeviceBuffer<bf16>> w;
  for (int i = 0; i < copies; ++i) {
    w.emplace_back(size_t(wsize));
    fill_random_bf16(w.back().data(), wsize, 1, uint64_t(i), 0, 0.05f, nullptr);
  }
  return w;
}

// "gate_up M=16 28672x4096": a result's shape label.
std::string shape_name(const MatShape& s, int64_t m) {
  char shape[64];
  std::snprintf(shape, sizeof shape, "%s M=%lld %lldx%lld", s.name, (long long)m, (long long)s.n, (long long)s.k);
  return shape;
}

void bench_matmul(double copy_gbs, CublasGemm& cublas, const std::vector<int64_t>& ms, bool gemm) {
  for (const MatShape& s : kShapes) {
    const int64_t wsize = s.n * s.k;
    const std::vector<DeviceBuffer<bf16>> w = rotating_weights(wsize);
    const int copies = int(w.size());
    for (int64_t m : ms) {
      DeviceBuffer<bf16> x(size_t(m * s.k)), y(size_t(m * s.n)), yref(size_t(m * s.n));
      fill_random_bf16(x.data(), m * s.k, 2, 0, 0, 1.0f, nullptr);
      cublas.gemm_bf16(x.data(), w[0].data(), yref.data(), m, s.n, s.k, nullptr);
      cuda_synchronize();
      const std::vector<float> ref = to_float(yref);
      const std::string shape = shape_name(s, m);
      const profile::Cost cost = profile::linear(m, s.n, s.k, 2);  // bf16 output
      double bytes = cost.bytes, flops = cost.flops;
      int reps = gemm ? 20 : 100;
      // Every version (v1, v2, ... of gemv.cu / gemm.cu), then the default choice ("kiln"), then cuBLAS.
      const int versions = gemm ? gemm_versions() : gemv_versions();
      for (int v = gemm ? g_gemm_first_version : 1; v <= versions + 1; ++v) {
        const int ver = v <= versions ? v : 0;
        auto run = [&](const bf16* wp) {
          if (gemm)
            gemm_version(ver, x.data(), wp, nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k, nullptr);
          else
            gemv_version(ver, x.data(), wp, nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k, nullptr);
        };
        y.poison();
        run(w[0].data());
        cuda_synchronize();
        double err = rel_error(to_float(y), ref);
        char label_buf[16];
        std::snprintf(label_buf, sizeof label_buf, "v%d", ver);
        const std::string label = ver ? label_buf : "kiln";
        if (!(err < 1e-2))
          std::printf("VALIDATION FAILED: %s %s M=%lld err %.3e\n", label.c_str(), s.name, (long long)m, err);
        double t = time_ms([&](int i) { run(w[size_t(i % copies)].data()); }, reps);
        record(gemm ? "gemm" : "gemv", shape, label, t, bytes, flops, copy_gbs, err);
      }
      double t_c = time_ms([&](int i) { cublas.gemm_bf16(x.data(), w[size_t(i % copies)].data(), yref.data(), m, s.n, s.k, nullptr); }, reps);
      record(gemm ? "gemm" : "gemv", shape, "cublas", t_c, bytes, flops, copy_gbs, 0);
    }
  }
}

// Batched decode (kGemvMaxRows < M <= kSplitKMaxRows): split-K ("splitk Sn": default partials, wgmma
// on sm_90a; "splitk-mma Sn": mma.sync v2 partials; n = slices used) next to the unsplit default
// GEMM ("gemm", what M = 17..256 ran before split-K), the dispatch ("matmul") and cuBLAS, each
// validated against cuBLAS first. GB/s counts the weight bytes only (N x K x 2: what must stream),
// so % copy is the share of the copy ceiling spent streaming W.
void bench_skinny(double copy_gbs, CublasGemm& cublas, const std::vector<int64_t>& ms) {
  DeviceBuffer<float> ws{size_t(kSplitKWorkspaceFloats)};
  const MatmulWorkspace wsv{ws.data(), kSplitKWorkspaceFloats};
  for (const MatShape& s : kShapes) {
    const int64_t wsize = s.n * s.k;
    const std::vector<DeviceBuffer<bf16>> w = rotating_weights(wsize);
    const int copies = int(w.size());
    for (int64_t m : ms) {
      DeviceBuffer<bf16> x(size_t(m * s.k)), y(size_t(m * s.n)), yref(size_t(m * s.n));
      fill_random_bf16(x.data(), m * s.k, 2, 0, 0, 1.0f, nullptr);
      cublas.gemm_bf16(x.data(), w[0].data(), yref.data(), m, s.n, s.k, nullptr);
      cuda_synchronize();
      const std::vector<float> ref = to_float(yref);
      const std::string shape = shape_name(s, m);
      const double wbytes = 2.0 * double(wsize), flops = 2.0 * double(m) * double(wsize);
      const int reps = 50;
      struct Variant {
        std::string label;
        std::function<void(const bf16*)> run;
      };
      std::vector<Variant> variants;
      variants.push_back({"gemm", [&](const bf16* wp) {
                            gemm_version(0, x.data(), wp, nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k, nullptr);
                          }});
      for (int version : {4, 5}) {  // v4 (one block per tile) and v5 (persistent), unsplit
        variants.push_back({"gemm v" + std::to_string(version), [&, version](const bf16* wp) {
                              gemm_version(version, x.data(), wp, nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k,
                                           nullptr);
                            }});
      }
      for (int version : {0, 2}) {
        const int S = gemm_splitk_plan(version, 0, m, s.n, s.k, kSplitKWorkspaceFloats);
        char label[32];
        std::snprintf(label, sizeof label, "%s S%d", version ? "splitk-mma" : "splitk", S);
        variants.push_back({label, [&, version](const bf16* wp) {
                              gemm_splitk(version, 0, x.data(), wp, nullptr, y.data(), OutMode::store_bf16, m, s.n,
                                          s.k, wsv, nullptr);
                            }});
      }
      variants.push_back({"matmul", [&](const bf16* wp) {
                            matmul(x.data(), wp, nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k, nullptr, wsv);
                          }});
      for (const Variant& v : variants) {
        y.poison();
        v.run(w[0].data());
        cuda_synchronize();
        const double err = rel_error(to_float(y), ref);
        if (!(err < 1e-2))
          std::printf("VALIDATION FAILED: %s %s M=%lld err %.3e\n", v.label.c_str(), s.name, (long long)m, err);
        const double t = time_ms([&](int i) { v.run(w[size_t(i % copies)].data()); }, reps);
        record("gemm-skinny", shape, v.label, t, wbytes, flops, copy_gbs, err);
      }
      const double t_c = time_ms(
          [&](int i) { cublas.gemm_bf16(x.data(), w[size_t(i % copies)].data(), yref.data(), m, s.n, s.k, nullptr); },
          reps);
      record("gemm-skinny", shape, "cublas", t_c, wbytes, flops, copy_gbs, 0);
    }
  }
}

// The prefill GEMM table last (the device run's reply carries the end of the output): TFLOP/s of
// v4, v5 and the default choice next to cuBLAS in the same run, and the default's ratio.
void print_gemm_summary() {
  std::printf("\n%-32s %8s %8s %8s %8s %8s %8s %8s %8s %7s\n", "gemm (TFLOP/s)", "v4", "v5", "v6 pp", "v7 c192",
              "v8 c256", "v9 c256t", "kiln", "cublas", "kiln/cb");
  std::string shape;
  double t[8] = {};  // v4 v5 v6 v7 v8 v9 kiln cublas
  auto flush = [&] {
    if (!shape.empty())
      std::printf("%-32s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %7.3f\n", shape.c_str(), t[0], t[1], t[2],
                  t[3], t[4], t[5], t[6], t[7], t[7] > 0 ? t[6] / t[7] : 0.0);
  };
  for (const auto& r : g_results) {
    if (r.value("kernel", "") != "gemm") continue;
    const std::string sh = r.value("shape", ""), v = r.value("version", "");
    if (sh.find(" M=512 ") == std::string::npos && sh.find(" M=2048 ") == std::string::npos &&
        sh.find(" M=4096 ") == std::string::npos)
      continue;
    if (sh != shape) {
      flush();
      shape = sh;
      std::fill(t, t + 8, 0.0);
    }
    const char* names[] = {"v4", "v5", "v6", "v7", "v8", "v9", "kiln", "cublas"};
    for (int i = 0; i < 8; ++i)
      if (v == names[i]) t[i] = r.value("tflops", 0.0);
  }
  flush();
}

// Prefill FLOPs as FlashAttention counts causal attention: 2 products of 2 S^2 H d, halved.
double causal_flops(int64_t n, int heads, int d) { return 4.0 * double(n) * double(n) / 2 * heads * d; }

// The wgmma prefill (version 3/4) checked on a small case against version 2 before anything is
// timed, and the result printed first: a wrong V descriptor (the one part of the kernel that is not
// shared with the wgmma GEMM) shows here at once.
void probe_wgmma_prefill() {
  const int heads = 8, kv_heads = 2, d = 128;
  const int64_t n = 300, kv_dim = kv_heads * d;
  DeviceBuffer<bf16> k(size_t(n * kv_dim)), v(k.size()), q(size_t(n * heads * d)), o2(q.size()), o3(q.size());
  fill_random_bf16(k.data(), int64_t(k.size()), 9, 0, 0, 1.0f, nullptr);
  fill_random_bf16(v.data(), int64_t(v.size()), 9, 1, 0, 1.0f, nullptr);
  fill_random_bf16(q.data(), int64_t(q.size()), 9, 2, 0, 1.0f, nullptr);
  KvLayout kv{k.data(), v.data(), 0, kv_dim, d};
  attention_prefill_version(2, q.data(), kv, o2.data(), n, 0, heads, kv_heads, d, nullptr);
  o3.poison();
  if (!attention_prefill_version(kPrefillWgmmaVersion, q.data(), kv, o3.data(), n, 0, heads, kv_heads, d, nullptr)) {
    std::printf("wgmma prefill: not available on this device\n");
    return;
  }
  cuda_synchronize();
  const double err = rel_error(to_float(o3), to_float(o2));
  std::printf("wgmma prefill probe: err vs mma.sync %.2e%s\n", err, err < 1e-2 ? " (ok)" : " (WRONG)");
}

// Decode tunings the lab compares (DecodeTuning: stages, waves of split blocks, PDL combine).
struct DecodeVariant {
  const char* label;
  DecodeTuning tune;
};
// Labels: s<stages> w<waves> p (PDL combine) i (interleaved tiles); "s3w1" is session 2's kernel.
const DecodeVariant kDecodeVariants[] = {
    {"kiln", {}},
    {"s3w1", {3, 1, 0, 0}},
    {"s3w1p", {3, 1, 1, 0}},
    {"s3w2p", {3, 2, 1, 0}},
    {"s3w4p", {3, 4, 1, 0}},
    {"s3w1pi", {3, 1, 1, 1}},
    {"s3w2pi", {3, 2, 1, 1}},
    {"s3w4pi", {3, 4, 1, 1}},
    {"s2w1p", {2, 1, 1, 0}},
    {"s2w2pi", {2, 2, 1, 1}},
    {"s2w4pi", {2, 4, 1, 1}},
    {"s4w1p", {4, 1, 1, 0}},
    {"s4w2pi", {4, 2, 1, 1}},
};

void bench_attention(double copy_gbs) {
  const int heads = 32, kv_heads = 8, d = 128;
  const int64_t kv_dim = kv_heads * d;
  // Contiguous decode: every tuning, validated against the default's output; GB/s on K/V bytes.
  // K/V copies rotate through more than 4x the L2 (b=1 L=8k is 34 MB). "kiln x10": the default's
  // per-call time in a run of 10 back-to-back calls (launch latency overlapped, as in a decode step
  // where attention follows other kernels), next to the single call between two events.
  for (auto [batch, len] : {std::pair<int64_t, int64_t>{1, 32768}, {64, 2048}, {1, 8192}}) {
    const int64_t kv_elems = batch * len * kv_dim;
    const int copies = int(std::max<int64_t>(1, kRotateBytes / (4 * kv_elems) + 1));
    std::vector<DeviceBuffer<bf16>> ks, vs;
    for (int i = 0; i < copies; ++i) {
      ks.emplace_back(size_t(kv_elems));
      vs.emplace_back(size_t(kv_elems));
      fill_random_bf16(ks.back().data(), kv_elems, 3, uint64_t(2 * i), 0, 1.0f, nullptr);
      fill_random_bf16(vs.back().data(), kv_elems, 3, uint64_t(2 * i + 1), 0, 1.0f, nullptr);
    }
    DeviceBuffer<bf16> q(size_t(batch * heads * d)), out(q.size()), out_ref(q.size());
    fill_random_bf16(q.data(), int64_t(q.size()), 3, 99, 0, 1.0f, nullptr);
    std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(len));
    DeviceBuffer<int32_t> dlen(lens);
    DeviceBuffer<float> ws(size_t(decode_workspace_floats(batch, heads, d, len)));
    auto kv_of = [&](int i) { return KvLayout{ks[size_t(i % copies)].data(), vs[size_t(i % copies)].data(), len * kv_dim, kv_dim, d}; };
    auto wsv = decode_workspace(ws.data(), batch, heads, d, len);
    attention_decode(q.data(), kv_of(0), dlen.data(), len, out_ref.data(), wsv, batch, heads, kv_heads, d, nullptr);
    cuda_synchronize();
    const std::vector<float> ref = to_float(out_ref);
    char shape[64];
    std::snprintf(shape, sizeof shape, "decode b=%lld L=%lld", (long long)batch, (long long)len);
    const double bytes = 2.0 * batch * len * kv_dim * 2, flops = 4.0 * batch * len * heads * d;
    for (const DecodeVariant& var : kDecodeVariants) {
      out.poison();
      attention_decode_tuned(var.tune, q.data(), kv_of(0), dlen.data(), len, out.data(), wsv, batch, heads, kv_heads,
                             d, nullptr);
      cuda_synchronize();
      const double err = rel_error(to_float(out), ref);
      if (!(err < 1e-2)) std::printf("VALIDATION FAILED: decode %s %s err %.3e\n", var.label, shape, err);
      const double ms = time_ms([&](int i) {
        attention_decode_tuned(var.tune, q.data(), kv_of(i), dlen.data(), len, out.data(), wsv, batch, heads,
                               kv_heads, d, nullptr);
      });
      record("attention", shape, var.label, ms, bytes, flops, copy_gbs, err);
    }
    const double ms10 = time_ms([&](int i) {
      for (int j = 0; j < 10; ++j)
        attention_decode(q.data(), kv_of(10 * i + j), dlen.data(), len, out.data(), wsv, batch, heads, kv_heads, d,
                         nullptr);
    }, 20, 2) / 10;
    record("attention", shape, "kiln x10", ms10, bytes, flops, copy_gbs, 0);
  }
  // Paged decode: the same shapes over a pool of 16-token blocks in shuffled order (what the
  // continuous-batching engine reads), validated bit for bit against the contiguous kernel on the
  // same values gathered into per-sequence caches; GB/s counts K/V bytes read (block tables aside).
  for (auto [batch, len] : {std::pair<int64_t, int64_t>{1, 32768}, {64, 2048}, {16, 8192}, {256, 512}}) {
    const int64_t bs = 16, per_seq = len / bs, num_blocks = batch * per_seq;
    DeviceBuffer<bf16> pk(size_t((num_blocks + 1) * bs * kv_dim)), pv(pk.size());
    DeviceBuffer<bf16> ck(size_t(batch * len * kv_dim)), cv(ck.size());
    DeviceBuffer<bf16> q(size_t(batch * heads * d)), out(q.size()), out_ref(q.size());
    fill_random_bf16(pk.data(), int64_t(pk.size()), 5, 0, 0, 1.0f, nullptr);
    fill_random_bf16(pv.data(), int64_t(pv.size()), 5, 1, 0, 1.0f, nullptr);
    fill_random_bf16(q.data(), int64_t(q.size()), 5, 2, 0, 1.0f, nullptr);
    std::vector<int32_t> table(static_cast<size_t>(num_blocks));
    for (int64_t i = 0; i < num_blocks; ++i) table[size_t(i)] = int32_t(i);
    std::mt19937 rng(7);
    std::shuffle(table.begin(), table.end(), rng);
    const int64_t block_bytes = bs * kv_dim * 2;
    for (int64_t i = 0; i < num_blocks; ++i) {  // sequence i / per_seq, block i % per_seq
      copy_device(ck.data() + i * bs * kv_dim, pk.data() + table[size_t(i)] * bs * kv_dim, block_bytes, nullptr);
      copy_device(cv.data() + i * bs * kv_dim, pv.data() + table[size_t(i)] * bs * kv_dim, block_bytes, nullptr);
    }
    DeviceBuffer<int32_t> dtable(table);
    std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(len));
    DeviceBuffer<int32_t> dlen(lens);
    DeviceBuffer<float> ws(size_t(decode_workspace_floats(batch, heads, d, len)));
    auto wsv = decode_workspace(ws.data(), batch, heads, d, len);
    KvLayout paged{pk.data(), pv.data(), 0, kv_dim, d};
    paged.block_table = dtable.data();
    paged.bt_stride = per_seq;
    paged.block_shift = 4;
    KvLayout contig{ck.data(), cv.data(), len * kv_dim, kv_dim, d};
    attention_decode(q.data(), contig, dlen.data(), len, out_ref.data(), wsv, batch, heads, kv_heads, d, nullptr);
    attention_decode(q.data(), paged, dlen.data(), len, out.data(), wsv, batch, heads, kv_heads, d, nullptr);
    cuda_synchronize();
    const double err = rel_error(to_float(out), to_float(out_ref));
    if (err != 0) std::printf("VALIDATION FAILED: paged decode differs from contiguous, err %.3e\n", err);
    const double bytes = 2.0 * batch * len * kv_dim * 2, flops = 4.0 * batch * len * heads * d;
    char shape[64];
    std::snprintf(shape, sizeof shape, "decode b=%lld L=%lld", (long long)batch, (long long)len);
    double ms = time_ms([&](int) {
      attention_decode(q.data(), contig, dlen.data(), len, out_ref.data(), wsv, batch, heads, kv_heads, d, nullptr);
    });
    record("attention", shape, "contig", ms, bytes, flops, copy_gbs, 0);
    ms = time_ms([&](int) {
      attention_decode(q.data(), paged, dlen.data(), len, out.data(), wsv, batch, heads, kv_heads, d, nullptr);
    });
    record("attention", shape, "paged16", ms, bytes, flops, copy_gbs, err);
  }
  {  // paged prefill (version 2: the engine's chunked prefill), one 4096-token sequence over shuffled 16-token blocks
    const int64_t n = 4096, bs = 16, num_blocks = n / bs;
    DeviceBuffer<bf16> pk(size_t((num_blocks + 1) * bs * kv_dim)), pv(pk.size()), q(size_t(n * heads * d)),
        out(q.size());
    fill_random_bf16(pk.data(), int64_t(pk.size()), 6, 0, 0, 1.0f, nullptr);
    fill_random_bf16(pv.data(), int64_t(pv.size()), 6, 1, 0, 1.0f, nullptr);
    fill_random_bf16(q.data(), int64_t(q.size()), 6, 2, 0, 1.0f, nullptr);
    std::vector<int32_t> table(static_cast<size_t>(num_blocks));
    for (int64_t i = 0; i < num_blocks; ++i) table[size_t(i)] = int32_t(i);
    std::mt19937 rng(8);
    std::shuffle(table.begin(), table.end(), rng);
    DeviceBuffer<int32_t> dtable(table);
    KvLayout paged{pk.data(), pv.data(), 0, kv_dim, d};
    paged.block_table = dtable.data();
    paged.bt_stride = num_blocks;
    paged.block_shift = 4;
    double ms = time_ms([&](int) { attention_prefill(q.data(), paged, out.data(), n, 0, heads, kv_heads, d, nullptr); },
                        10, 1);
    record("attention", "prefill causal 4096", "paged16", ms, 2.0 * n * (heads * d * 2 + kv_dim * 2),
           causal_flops(n, heads, d), copy_gbs, 0);
  }
  // Contiguous prefill: version 2 (mma.sync), version 3 (wgmma, sm_90a) and the default, each
  // validated against version 2; head dims 128 (the acceptance shape) and 64.
  for (auto [n, hd] : {std::pair<int64_t, int>{4096, 128}, {16384, 128}, {4096, 64}, {16384, 64}}) {
    const int64_t kvd = kv_heads * hd;
    DeviceBuffer<bf16> k(size_t(n * kvd)), v(k.size()), q(size_t(n * heads * hd)), out(q.size()), out2(q.size());
    fill_random_bf16(k.data(), int64_t(k.size()), 4, 0, 0, 1.0f, nullptr);
    fill_random_bf16(v.data(), int64_t(v.size()), 4, 1, 0, 1.0f, nullptr);
    fill_random_bf16(q.data(), int64_t(q.size()), 4, 2, 0, 1.0f, nullptr);
    KvLayout kv{k.data(), v.data(), 0, kvd, hd};
    attention_prefill_version(2, q.data(), kv, out2.data(), n, 0, heads, kv_heads, hd, nullptr);
    cuda_synchronize();
    const std::vector<float> ref = to_float(out2);
    char shape[64];
    std::snprintf(shape, sizeof shape, "prefill causal %lld d%d", (long long)n, hd);
    const double bytes = 2.0 * n * (heads * hd * 2 + kvd * 2), flops = causal_flops(n, heads, hd);
    for (int version : {2, 3, 4, 0}) {
      auto run = [&] {
        return version ? attention_prefill_version(version, q.data(), kv, out.data(), n, 0, heads, kv_heads, hd, nullptr)
                       : (attention_prefill(q.data(), kv, out.data(), n, 0, heads, kv_heads, hd, nullptr), true);
      };
      out.poison();
      if (!run()) continue;
      cuda_synchronize();
      const double err = rel_error(to_float(out), ref);
      if (!(err < 1e-2)) std::printf("VALIDATION FAILED: prefill v%d %s err %.3e\n", version, shape, err);
      const double ms = time_ms([&](int) { run(); }, n > 8192 ? 10 : 20, 2);
      const std::string label = version == 0 ? std::string("kiln:") + attention_prefill_impl(q.data(), kv, out.data(), hd)
                                             : "v" + std::to_string(version);
      record("attention", shape, label, ms, bytes, flops, copy_gbs, err);
    }
  }
}


// Quantized products (kernels/cuda/quant) on the same shapes: for each format the fused decode GEMV
// (M = 1, 16) and the prefill path (M = 2048: fp8's wgmma GEMM; int8/int4 dequantize + bf16 GEMM),
// next to the bf16 GEMV and cuBLAS bf16. GB/s counts the bytes actually read: the packed weights and
// their scales, x and y (cost model with the format's bytes per weight). Validated against cuBLAS on
// the dequantized weights (fp8 also quantizes x per token: W8A8 sits ~3% from that W8A16 reference).
void bench_quant(double copy_gbs, CublasGemm& cublas) {
  struct Fmt {
    QuantFormat f;
    int64_t group;  // 0: per channel
    const char* label;
  };
  const Fmt fmts[] = {{QuantFormat::int8, 0, "int8"},
                      {QuantFormat::int8, 32, "int8-g32"},
                      {QuantFormat::int4, 128, "int4"},
                      {QuantFormat::int4, 32, "int4-g32"},
                      {QuantFormat::fp8, 0, "fp8"}};
  const std::vector<int64_t> decode_ms = g_quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 16};
  const std::vector<int64_t> prefill_ms = g_quick || g_decode_only ? std::vector<int64_t>{} : std::vector<int64_t>{2048};
  for (const MatShape& s : kShapes) {
    const int64_t mmax = 2048;
    DeviceBuffer<bf16> x(size_t(mmax * s.k)), y(size_t(mmax * s.n)), yref(size_t(mmax * s.n)), wdq(size_t(s.n * s.k));
    DeviceBuffer<uint8_t> xq(size_t(mmax * s.k));
    DeviceBuffer<float> xs{size_t(mmax)};
    fill_random_bf16(x.data(), mmax * s.k, 2, 0, 0, 1.0f, nullptr);
    // bf16 baselines on this shape (the default GEMV / GEMM and cuBLAS), weights rotated.
    {
      const std::vector<DeviceBuffer<bf16>> w = rotating_weights(s.n * s.k);
      const int copies = int(w.size());
      for (int64_t m : decode_ms) {
        const std::string shape = shape_name(s, m);
        const profile::Cost cost = profile::linear(m, s.n, s.k, 2);
        double t = time_ms([&](int i) { matmul(x.data(), w[size_t(i % copies)].data(), nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k, nullptr); }, 100);
        record("qgemv", shape, "bf16", t, cost.bytes, cost.flops, copy_gbs, 0);
        t = time_ms([&](int i) { cublas.gemm_bf16(x.data(), w[size_t(i % copies)].data(), yref.data(), m, s.n, s.k, nullptr); }, 100);
        record("qgemv", shape, "cublas", t, cost.bytes, cost.flops, copy_gbs, 0);
      }
      for (int64_t m : prefill_ms) {
        const std::string shape = shape_name(s, m);
        const profile::Cost cost = profile::linear(m, s.n, s.k, 2);
        double t = time_ms([&](int i) { matmul(x.data(), w[size_t(i % copies)].data(), nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k, nullptr); }, 10, 2);
        record("qgemm", shape, "bf16", t, cost.bytes, cost.flops, copy_gbs, 0);
        t = time_ms([&](int i) { cublas.gemm_bf16(x.data(), w[size_t(i % copies)].data(), yref.data(), m, s.n, s.k, nullptr); }, 10, 2);
        record("qgemm", shape, "cublas", t, cost.bytes, cost.flops, copy_gbs, 0);
      }
    }
    for (const Fmt& f : fmts) {
      const int64_t group = f.group ? f.group : s.k;
      if (!qweight_packable(f.f, s.k, group)) continue;
      const int64_t qbytes = qweight_data_bytes(f.f, s.n, s.k), sfloats = qweight_scale_floats(f.f, s.n, s.k, group);
      const int copies = int(std::max<int64_t>(1, kRotateBytes / (qbytes + 4 * sfloats) + 1));
      std::vector<DeviceBuffer<uint8_t>> wq;
      std::vector<DeviceBuffer<float>> ws;
      std::vector<QWeight> views;
      for (int i = 0; i < copies; ++i) {
        wq.emplace_back(size_t(qbytes));
        ws.emplace_back(size_t(sfloats));
        fill_random_qweight(f.f, s.n, s.k, group, wq.back().data(), ws.back().data(), 11, uint64_t(i), 0.05f, nullptr);
        views.push_back({f.f, s.n, s.k, group, wq.back().data(), ws.back().data()});
      }
      dequantize_to_bf16(views[0], wdq.data(), nullptr);
      QScratch scratch{wdq.data(), s.n * s.k, xq.data(), xs.data(), mmax * s.k, mmax};
      profile::Widths widths;
      widths.weight = qweight_bytes_per_weight(f.f, s.k, group);
      const double tol = f.f == QuantFormat::fp8 ? 8e-2 : 1e-2;
      for (int64_t m : decode_ms) {
        cublas.gemm_bf16(x.data(), wdq.data(), yref.data(), m, s.n, s.k, nullptr);
        const std::string shape = shape_name(s, m);
        profile::Cost cost = profile::linear(m, s.n, s.k, 2, widths);
        y.poison();
        qmatmul(x.data(), views[0], nullptr, y.data(), OutMode::store_bf16, m, nullptr, {}, scratch);
        cuda_synchronize();
        std::vector<float> got = to_float(y), ref = to_float(yref);
        got.resize(size_t(m * s.n));
        ref.resize(got.size());
        const double err = rel_error(got, ref);
        if (!(err < tol)) std::printf("VALIDATION FAILED: %s %s err %.3e\n", f.label, shape.c_str(), err);
        double t;
        if (f.f == QuantFormat::fp8) {
          fp8_quantize_rows(x.data(), m, s.k, xq.data(), xs.data(), nullptr);
          t = time_ms([&](int i) { fp8_gemv(xq.data(), xs.data(), views[size_t(i % copies)], nullptr, y.data(), OutMode::store_bf16, m, nullptr); }, 100);
          cost.bytes += double(m * s.k) * (1.0 - 2.0);  // reads e4m3 activations, not bf16
        } else {
          // v1 (session 3's default), v4 (v3 without the shared-memory staging of x) and v5 (v3 with one
          // tile per block) next to the default (v3), each validated first.
          for (int v : {1, 4, 5}) {
            qgemv_set_version(v);
            y.poison();
            qgemv(x.data(), views[0], nullptr, y.data(), OutMode::store_bf16, m, nullptr);
            cuda_synchronize();
            std::vector<float> gv = to_float(y);
            gv.resize(size_t(m * s.n));
            const double ev = rel_error(gv, ref);
            if (!(ev < tol)) std::printf("VALIDATION FAILED: %s-v%d %s err %.3e\n", f.label, v, shape.c_str(), ev);
            t = time_ms([&](int i) { qgemv(x.data(), views[size_t(i % copies)], nullptr, y.data(), OutMode::store_bf16, m, nullptr); }, 100);
            record("qgemv", shape, std::string(f.label) + "-v" + std::to_string(v), t, cost.bytes, cost.flops, copy_gbs, ev);
          }
          qgemv_set_version(0);
          t = time_ms([&](int i) { qgemv(x.data(), views[size_t(i % copies)], nullptr, y.data(), OutMode::store_bf16, m, nullptr); }, 100);
        }
        record("qgemv", shape, f.label, t, cost.bytes, cost.flops, copy_gbs, err);
        if (f.f == QuantFormat::fp8) {  // with the activation quantization in front (what the backend runs)
          const profile::Cost c2 = profile::linear(m, s.n, s.k, 2, widths);
          t = time_ms([&](int i) { qmatmul(x.data(), views[size_t(i % copies)], nullptr, y.data(), OutMode::store_bf16, m, nullptr, {}, scratch); }, 100);
          record("qgemv", shape, "fp8+quant", t, c2.bytes, c2.flops, copy_gbs, err);
        }
      }
      for (int64_t m : prefill_ms) {
        cublas.gemm_bf16(x.data(), wdq.data(), yref.data(), m, s.n, s.k, nullptr);
        const std::string shape = shape_name(s, m);
        const profile::Cost cost = profile::linear(m, s.n, s.k, 2, widths);
        y.poison();
        qmatmul(x.data(), views[0], nullptr, y.data(), OutMode::store_bf16, m, nullptr, {}, scratch);
        cuda_synchronize();
        const double err = rel_error(to_float(y), to_float(yref));
        if (!(err < tol)) std::printf("VALIDATION FAILED: %s %s err %.3e\n", f.label, shape.c_str(), err);
        const double t = time_ms([&](int i) { qmatmul(x.data(), views[size_t(i % copies)], nullptr, y.data(), OutMode::store_bf16, m, nullptr, {}, scratch); }, 10, 2);
        record("qgemm", shape, f.label, t, cost.bytes, cost.flops, copy_gbs, err);
        if (f.f == QuantFormat::fp8) {  // the GEMM alone (activations already quantized)
          const double tg = time_ms([&](int i) { fp8_gemm(xq.data(), xs.data(), views[size_t(i % copies)], nullptr, y.data(), OutMode::store_bf16, m, nullptr); }, 10, 2);
          record("qgemm", shape, "fp8-gemm", tg, cost.bytes - double(m * s.k), cost.flops, copy_gbs, err);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool skinny_only = false, attention_only = false, quant_only = false, gemv_only = false, gemm_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) g_quick = true;
    else if (!std::strcmp(argv[i], "--skinny")) skinny_only = true;
    else if (!std::strcmp(argv[i], "--attention")) attention_only = true;
    else if (!std::strcmp(argv[i], "--quant")) quant_only = true;
    else if (!std::strcmp(argv[i], "--decode")) quant_only = g_decode_only = true;
    else if (!std::strcmp(argv[i], "--gemv")) gemv_only = true;
    else if (!std::strcmp(argv[i], "--gemm")) gemm_only = true;
    else {
      std::fprintf(stderr, "usage: kernel_lab [--json PATH] [--quick] [--skinny] [--attention] [--quant] [--decode] "
                           "[--gemv] [--gemm]\n");
      return 2;
    }
  }
  try {
    if (cuda_device_count() == 0) {
      std::fprintf(stderr, "kernel_lab: no CUDA device\n");
      return 1;
    }
    DeviceInfo info = device_info();
    std::printf("device: %s, %d SMs, L2 %lld MB, cc %d.%d\n", info.name.c_str(), info.sm_count,
                (long long)(info.l2_bytes >> 20), info.cc_major, info.cc_minor);
    double copy_gbs = copy_ceiling();
    if (gemm_only) {
      CublasGemm cublas;
      g_gemm_first_version = 4;
      bench_skinny(copy_gbs, cublas, {64, 128, 256});
      bench_matmul(copy_gbs, cublas, {512, 2048, 4096}, true);
    } else if (quant_only) {
      CublasGemm cublas;
      bench_quant(copy_gbs, cublas);
    } else if (gemv_only) {  // the decode GEMVs (M = 1..16) of every version against cuBLAS
      CublasGemm cublas;
      bench_matmul(copy_gbs, cublas, {1, 2, 4, 8, 16}, false);
    } else if (!attention_only) {
      CublasGemm cublas;
      if (!skinny_only) {
        bench_matmul(copy_gbs, cublas, g_quick ? std::vector<int64_t>{1, 2, 4, 8, 16} : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 12, 16}, false);
        bench_matmul(copy_gbs, cublas, g_quick ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 2048, 4096}, true);
      }
      bench_skinny(copy_gbs, cublas, g_quick ? std::vector<int64_t>{64} : std::vector<int64_t>{32, 64, 128, 256});
    }
    if (!skinny_only && !quant_only && !gemv_only && !gemm_only) {
      probe_wgmma_prefill();
      bench_attention(copy_gbs);
    }
    print_gemm_summary();
    if (!json_path.empty()) {
      nlohmann::json doc = {{"device", info.name}, {"copy_gbs", copy_gbs}, {"peak_tflops", kPeakTflops},
                            {"results", g_results}};
      std::ofstream(json_path) << doc.dump(2) << "\n";
      std::printf("wrote %s\n", json_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_lab: %s\n", e.what());
    return 1;
  }
  return 0;
}
