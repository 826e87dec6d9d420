// kernel_lab: every kernel on the Llama-3-8B shapes, validated against cuBLAS (matrix products),
// then timed with CUDA events: warm-up, median of many repetitions, inputs rotated through more
// than the 60 MB L2. Prints achieved GB/s or TFLOP/s next to the ceilings measured in the same
// run (a 16-byte copy kernel) or assumed (kPeakTflops), and writes everything to --json PATH. Beside
// each M = 1 GEMV: "copy" (its bytes copied, half read and half written) and "read" (its bytes only
// read), each timed as one call: how far a memory-bound call of that size can go.
//   kernel_lab [--json PATH] [--quick] [--skinny] [--attention] [--quant] [--decode] [--gemv] [--gemm]
//              [--gemm-m M] [--gemm-add] [--attention-batch] [--model PRESET] [--unheld]
//   (--skinny: only the batched-decode GEMMs, M = 32..256; --attention: only the attention kernels;
//    --quant: only the quantized products, int8 / int4 / fp8, next to bf16 and cuBLAS; --decode: those
//    at M = 1 and 16 only; --gemv: only the bf16 decode GEMVs, M = 1..16, every version;
//    --gemm: only the batched-decode GEMMs at M = 64..256 and the prefill GEMM versions 4.. at
//    M = 512 / 2048 / 4096, with a summary table last; --gemm-m M: (implies --gemm) only the prefill GEMM
//    versions at that one M, no batched-decode GEMMs: the cheapest run for one M's candidates;
//    --gemm-add: only the residual-add products (o, down into fp32) at prefill M, the default
//    against v18 / v19; --attention-batch: only the paged decode attention at many short sequences;
//    --kv-pool: only that decode over an engine-shaped pool of 32 layers (one layer's region vs the
//    32 in turn, consecutive vs shuffled block ids); --handoff: only the cost of one kernel boundary,
//    plain launches vs PDL vs a polled counter (kernel_lab_handoff.cpp); --overlap: only a half decode
//    step's GEMM and attention at once on two streams, then on two green-context SM partitions
//    (kernel_lab_overlap.cpp);
//    --model PRESET: the matrix shapes of another `kiln --random` preset, e.g. qwen2.5-7b, instead of
//    llama3-8b's; --default-only: of the prefill GEMM versions only the default's choice and cuBLAS;
//    --sustain S: each prefill GEMM and cuBLAS also run back to back for ~S seconds, twice in turn,
//    the rate at the board's power limit)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/cublas_ref.h"
#include "backend/cuda/device_buffer.h"
#include "core/dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "kernels/cuda/random_fill.h"
#include "model/random_weights.h"
#include "profile/cost_model.h"
#include "kernel_lab.h"

using namespace kiln;
using namespace kiln::cuda;
using namespace kiln::lab;

namespace {

// A model's five projection shapes (N x K: output rows by input width), from its preset
// (model/random_weights.h): fused q|k|v, o, fused gate|up, down, the output head.
std::vector<MatShape> shapes_of(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  return {{"qkv", c.q_dim() + 2 * c.kv_dim(), H}, {"o", H, c.q_dim()}, {"gate_up", 2 * I, H}, {"down", H, I},
          {"lm_head", c.vocab_size, H}};
}
// The shapes every bench below walks: Llama-3-8B's (6144 / 4096 / 28672 / 4096 / 128256 x 4096,
// down 4096 x 14336) unless --model names another preset (e.g. qwen2.5-7b).
std::vector<MatShape> g_shapes = shapes_of(preset_config("llama3-8b"));

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

void bench_matmul(double copy_gbs, CublasGemm& cublas, const std::vector<int64_t>& ms, bool gemm) {
  for (const MatShape& s : g_shapes) {
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
      double t_kiln = 0;  // the default's median (--sustain sizes its loop by it)
      // Every version (v1, v2, ... of gemv.cu / gemm.cu), then the default choice ("kiln"), then cuBLAS.
      const int versions = gemm ? gemm_versions() : gemv_versions();
      const int v0 = gemm ? (g_gemm_default_only ? versions + 1 : g_gemm_first_version) : 1;
      for (int v = v0; v <= versions + 1; ++v) {
        const int ver = v <= versions ? v : 0;
        if (gemm && (ver == 18 || ver == 19)) continue;  // residual-add epilogues: --gemm-add times them
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
        if (ver == 0) t_kiln = t;
      }
      auto cublas_call = [&](int i) {
        cublas.gemm_bf16(x.data(), w[size_t(i % copies)].data(), yref.data(), m, s.n, s.k, nullptr);
      };
      double t_c = time_ms(cublas_call, reps);
      record(gemm ? "gemm" : "gemv", shape, "cublas", t_c, bytes, flops, copy_gbs, 0);
      if (gemm && g_sustain_seconds > 0) {
        // --sustain S: the default and cuBLAS each run back to back for ~S seconds inside one timed
        // repetition, twice in turn, so the board reaches its power limit as the engine's long
        // steps do (the timings above are short bursts).
        auto default_call = [&](int i) {
          gemm_version(0, x.data(), w[size_t(i % copies)].data(), nullptr, y.data(), OutMode::store_bf16, m, s.n, s.k,
                       nullptr);
        };
        for (int round = 0; round < 2; ++round)
          for (const bool ours : {true, false}) {
            const int n = std::max(10, int(g_sustain_seconds * 1e3 / (ours ? t_kiln : t_c)));
            const double ms = time_ms([&](int) {
              for (int c = 0; c < n; ++c) ours ? default_call(c) : cublas_call(c);
            }, 1, 0);
            record("gemm-sustained", shape, ours ? "kiln" : "cublas", ms / n, bytes, flops, copy_gbs, 0);
          }
      }
      if (!gemm && (m == 1 || m == 16)) {
        // In sequence (time_in_sequence; o after the attention combine, down after gate/up in the
        // decode step): the default, v2 (gemv_mma.cuh's plain loop), v5 / v6 (gemv_wgmma.cu), cuBLAS.
        for (const int ver : {2, 5, 6, 0}) {
          const double t_seq = time_in_sequence([&](int c) {
            gemv_version(ver, x.data(), w[size_t(c % copies)].data(), nullptr, y.data(), OutMode::store_bf16, m, s.n,
                         s.k, nullptr);
          }, reps / 2);
          record("gemv", shape, ver ? version_label(ver) + "-seq" : std::string("kiln-seq"), t_seq, bytes, flops,
                 copy_gbs, 0);
        }
        const double t_cseq = time_in_sequence([&](int c) {
          cublas.gemm_bf16(x.data(), w[size_t(c % copies)].data(), yref.data(), m, s.n, s.k, nullptr);
        }, reps / 2);
        record("gemv", shape, "cublas-seq", t_cseq, bytes, flops, copy_gbs, 0);
      }
      if (!gemm && m == 1) {
        const int64_t half = wsize;  // bytes: half of the weight's N x K x 2
        record("gemv", shape, "copy", copy_traffic_ms(half), 2.0 * double(half), 0, copy_gbs, 0);
        record("gemv", shape, "read", read_traffic_ms(2 * half), 2.0 * double(half), 0, copy_gbs, 0);
      }
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
  for (const MatShape& s : g_shapes) {
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

// The residual-add products (o, down: OutMode::add_f32 into the fp32 residual, as the engine runs
// them) at prefill M: the default GEMM (kiln: the register epilogue with its batched reads), v8 /
// v6 (cooperative 128x256 / ping-pong 128x128, register add) and v18 / v19 (the same tiles with the
// TMA reduce-add epilogue). Each version's first call adds into the same starting y; v18 / v19 must
// give their register twin's bits. The timed calls keep adding (the values only grow). No cuBLAS
// column: its bf16 GEMM does not add into an fp32 output.
void bench_gemm_add(double copy_gbs) {
  for (const MatShape& s : g_shapes) {
    if (std::strcmp(s.name, "o") != 0 && std::strcmp(s.name, "down") != 0) continue;
    const std::vector<DeviceBuffer<bf16>> w = rotating_weights(s.n * s.k);
    const int copies = int(w.size());
    for (int64_t m : {int64_t(512), int64_t(2048), int64_t(4096)}) {
      DeviceBuffer<bf16> x(size_t(m * s.k));
      fill_random_bf16(x.data(), m * s.k, 3, 0, 0, 1.0f, nullptr);
      std::vector<float> y0(size_t(m * s.n));
      for (size_t i = 0; i < y0.size(); ++i) y0[i] = float(int64_t(i * 2654435761u % 2001) - 1000) / 1000.0f;
      DeviceBuffer<float> y(y0.size());
      const profile::Cost cost = profile::linear(m, s.n, s.k, 8);  // add_f32: y read + written
      std::map<int, std::vector<float>> first;  // each version's first result
      for (int ver : {0, 8, 18, 6, 19}) {
        y.upload(y0);
        gemm_version(ver, x.data(), w[0].data(), nullptr, y.data(), OutMode::add_f32, m, s.n, s.k, nullptr);
        cuda_synchronize();
        first[ver] = y.to_host();
        const int twin = ver == 18 ? 8 : ver == 19 ? 6 : -1;
        int64_t diff = 0;
        if (twin >= 0)
          for (size_t i = 0; i < first[ver].size(); ++i)
            diff += std::memcmp(&first[ver][i], &first[twin][i], sizeof(float)) != 0;
        if (diff)
          std::printf("VALIDATION FAILED: gemm-add v%d %s M=%lld: %lld values differ from v%d's\n", ver, s.name,
                      (long long)m, (long long)diff, twin);
        const double t = time_ms([&](int i) {
          gemm_version(ver, x.data(), w[size_t(i % copies)].data(), nullptr, y.data(), OutMode::add_f32, m, s.n, s.k,
                       nullptr);
        }, 20);
        record("gemm-add", shape_name(s, m), ver ? version_label(ver) : std::string("kiln"), t, cost.bytes,
               cost.flops, copy_gbs, 0);
      }
    }
  }
}

// The prefill GEMM table last (the device run's reply carries the end of the output): TFLOP/s of
// every wgmma version and the default choice next to cuBLAS in the same run, and the ratios.
// Columns: v4 .. v15 (v10 / v11: cooperative 128x224, register / TMA-store epilogue; v12: 128x256
// split-K over a 2-CTA cluster; v13 / v14 / v15: 128x128 / 192 / 256 with W multicast over a 2-CTA
// cluster; v16 / v17: 128x128 / 128x192 with the TMA-store epilogue), then the best version's
// ratio to cuBLAS ("best/cb") next to kiln's.
void print_gemm_summary() {
  constexpr int kCols = 16;  // v4 .. v17, kiln, cublas
  const char* names[kCols] = {"v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15",
                              "v16", "v17", "kiln", "cublas"};
  const char* heads[kCols] = {"v4", "v5", "v6 pp", "v7 c192", "v8 c256", "v9 c256t", "v10 c224", "v11 224t",
                              "v12 sk2", "v13 m128", "v14 m192", "v15 m256", "v16 128t", "v17 192t", "kiln",
                              "cublas"};
  constexpr int kKiln = kCols - 2, kCublas = kCols - 1, kVersions = kKiln;  // columns of versions: 0 .. kKiln - 1
  // --default-only timed no versions: their columns and best/cb are left out.
  const int first = g_gemm_default_only ? kKiln : 0;
  std::printf("\n%-28s", "gemm (TFLOP/s)");
  for (int i = first; i <= kCublas; ++i) std::printf(" %8s", heads[i]);
  std::printf(" %7s", "kiln/cb");
  if (!g_gemm_default_only) std::printf(" %7s", "best/cb");
  std::printf("\n");
  std::string shape;
  double t[kCols] = {};
  auto flush = [&] {
    if (shape.empty()) return;
    std::printf("%-28s", shape.c_str());
    double best = 0.0;
    for (int i = first; i <= kCublas; ++i) std::printf(" %8.1f", t[i]);
    for (int i = 0; i < kVersions; ++i) best = std::max(best, t[i]);
    std::printf(" %7.3f", t[kCublas] > 0 ? t[kKiln] / t[kCublas] : 0.0);
    if (!g_gemm_default_only) std::printf(" %7.3f", t[kCublas] > 0 ? best / t[kCublas] : 0.0);
    std::printf("\n");
  };
  for (const auto& r : g_results) {
    if (r.value("kernel", "") != "gemm") continue;
    const std::string sh = r.value("shape", ""), v = r.value("version", "");
    if (sh != shape) {
      flush();
      shape = sh;
      std::fill(t, t + kCols, 0.0);
    }
    for (int i = 0; i <= kCublas; ++i)
      if (v == names[i]) t[i] = r.value("tflops", 0.0);
  }
  flush();
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
  for (const MatShape& s : g_shapes) {
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
          // In sequence, as bench_matmul's "kiln-seq" (time_in_sequence).
          const double t_seq = time_in_sequence([&](int c) {
            qgemv(x.data(), views[size_t(c % copies)], nullptr, y.data(), OutMode::store_bf16, m, nullptr);
          }, 50);
          record("qgemv", shape, std::string(f.label) + "-seq", t_seq, cost.bytes, cost.flops, copy_gbs, err);
          if (m == 1) {  // the same bytes copied between buffers of their own, as the bf16 rows' "copy"
            const int64_t half = int64_t(cost.bytes / 2) & ~int64_t(15);
            record("qgemv", shape, std::string(f.label) + "-copy", copy_traffic_ms(half), 2.0 * double(half), 0,
                   copy_gbs, 0);
            record("qgemv", shape, std::string(f.label) + "-read", read_traffic_ms(2 * half), 2.0 * double(half), 0,
                   copy_gbs, 0);
          }
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
  bool attention_batch_only = false, gemm_add_only = false, fp8_gemm_only = false, kv_pool_only = false;
  bool handoff_only = false, overlap_only = false;
  int64_t gemm_m = 0;  // --gemm-m: one prefill M only (0: 512, 2048 and 4096); with --fp8-gemm, its M
  std::string model = "llama3-8b";  // --model: the preset whose projection shapes the benches walk
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) g_quick = true;
    else if (!std::strcmp(argv[i], "--skinny")) skinny_only = true;
    else if (!std::strcmp(argv[i], "--attention")) attention_only = true;
    else if (!std::strcmp(argv[i], "--attention-batch")) attention_batch_only = true;
    else if (!std::strcmp(argv[i], "--kv-pool")) kv_pool_only = true;
    else if (!std::strcmp(argv[i], "--handoff")) handoff_only = true;
    else if (!std::strcmp(argv[i], "--overlap")) overlap_only = true;
    else if (!std::strcmp(argv[i], "--quant")) quant_only = true;
    else if (!std::strcmp(argv[i], "--decode")) quant_only = g_decode_only = true;
    else if (!std::strcmp(argv[i], "--gemv")) gemv_only = true;
    else if (!std::strcmp(argv[i], "--gemm")) gemm_only = true;
    else if (!std::strcmp(argv[i], "--gemm-add")) gemm_add_only = true;
    else if (!std::strcmp(argv[i], "--fp8-gemm")) fp8_gemm_only = true;
    else if (!std::strcmp(argv[i], "--gemm-m") && i + 1 < argc && std::atoll(argv[i + 1]) > 0)
      gemm_only = true, gemm_m = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
    else if (!std::strcmp(argv[i], "--unheld")) g_held = false;
    else if (!std::strcmp(argv[i], "--default-only")) g_gemm_default_only = true;
    else if (!std::strcmp(argv[i], "--sustain") && i + 1 < argc) g_sustain_seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: kernel_lab [--json PATH] [--quick] [--skinny] [--attention] [--quant] [--decode] "
                           "[--gemv] [--gemm] [--gemm-m M] [--gemm-add] [--fp8-gemm] [--attention-batch] [--kv-pool] [--handoff] [--overlap] [--model PRESET] "
                           "[--unheld] [--default-only] [--sustain SECONDS]\n");
      return 2;
    }
  }
  try {
    g_shapes = shapes_of(preset_config(model));
    std::printf("shapes: %s (qkv %lldx%lld, gate_up %lldx%lld, down %lldx%lld, lm_head %lldx%lld)\n", model.c_str(),
                (long long)g_shapes[0].n, (long long)g_shapes[0].k, (long long)g_shapes[2].n, (long long)g_shapes[2].k,
                (long long)g_shapes[3].n, (long long)g_shapes[3].k, (long long)g_shapes[4].n, (long long)g_shapes[4].k);
    if (cuda_device_count() == 0) {
      std::fprintf(stderr, "kernel_lab: no CUDA device\n");
      return 1;
    }
    DeviceInfo info = device_info();
    std::printf("device: %s, %d SMs, L2 %lld MB, cc %d.%d\n", info.name.c_str(), info.sm_count,
                (long long)(info.l2_bytes >> 20), info.cc_major, info.cc_minor);
    double copy_gbs = copy_ceiling();
    if (overlap_only) {
      bench_overlap(copy_gbs, info.sm_count);
    } else if (handoff_only) {
      bench_handoff(info.sm_count);
    } else if (attention_batch_only) {
      bench_decode_batched(copy_gbs);
    } else if (kv_pool_only) {
      bench_decode_kv_pool(copy_gbs);
    } else if (gemm_add_only) {
      bench_gemm_add(copy_gbs);
    } else if (fp8_gemm_only) {
      CublasGemm cublas;
      bench_fp8_gemm(copy_gbs, cublas, g_shapes, gemm_m > 0 ? std::vector<int64_t>{gemm_m}
                                                             : std::vector<int64_t>{512, 2048, 4096});
    } else if (gemm_only) {
      CublasGemm cublas;
      g_gemm_first_version = 4;
      // v12 needs m_tiles x n_tiles clusters of 2 resident at once for one round (o M = 512: 64).
      std::printf("gemm v12: %d clusters of 2 CTAs resident at once\n", gemm_wgmma_cluster_max_active());
      std::printf("gemm v13 / v14 / v15: %d / %d / %d clusters of 2 CTAs resident at once\n",
                  gemm_wgmma_multicast_max_active(128), gemm_wgmma_multicast_max_active(192),
                  gemm_wgmma_multicast_max_active(256));
      if (gemm_m > 0) {
        bench_matmul(copy_gbs, cublas, {gemm_m}, true);
      } else {
        bench_skinny(copy_gbs, cublas, {64, 128, 256});
        bench_matmul(copy_gbs, cublas, {512, 2048, 4096}, true);
      }
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
    if (!skinny_only && !quant_only && !gemv_only && !gemm_only && !attention_batch_only && !gemm_add_only &&
        !fp8_gemm_only && !kv_pool_only && !handoff_only && !overlap_only) {
      probe_wgmma_prefill();
      bench_attention(copy_gbs);
    }
    print_gemm_summary();
    if (!json_path.empty()) {
      nlohmann::json doc = {{"device", info.name}, {"copy_gbs", copy_gbs}, {"peak_tflops", kPeakTflops},
                            {"timing", g_held ? "held stream (events bracket the GPU's run)" : "unheld (launch from idle)"},
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
