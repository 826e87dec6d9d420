// The whole model with quantized projections: CudaBackend against CpuBackend on a small random
// config whose q/k/v, o, gate/up and down weights are quantized (int8 per channel and in groups of
// 32, int4 in groups of 128 and 32, fp8 per channel), the embedding and head bf16. Both backends
// multiply the same dequantized values (the GPU straight from the packed codes), so the difference
// is what it is for bf16 weights (bf16 activations between GPU kernels against fp32 on the CPU):
// kTolLogits as in backend_test.cpp. fp8 is W8A8: each side quantizes its own activations per token
// (the GPU from bf16 values, the CPU from fp32), and an activation whose bf16 rounding crosses an
// e4m3 rounding boundary (a few percent of them) moves by one e4m3 step (1/16 relative), so its
// logits sit further apart: kTolLogitsFp8. Top-1 must agree wherever the CPU's top-2 gap is clearly
// above that noise.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "fused_decode_test_util.h"
#include "gpu_test_models.h"
#include "gpu_test_util.h"
#include "model/random_weights.h"
#include "quant/fp8_e4m3.h"

namespace kiln::gputest {
namespace {

constexpr double kTolLogits = 3e-2;
constexpr double kTolLogitsFp8 = 0.15;  // measured 0.085-0.108 on the H200 (run 2)

// Round-to-nearest quantization of m.data (rows of `group` values share a scale), data replaced by
// the dequantized values. int4 asymmetric (min = the group's minimum), int8 and fp8 symmetric.
void quantize(HostMatrix& m, QuantFormat f, int64_t group) {
  QuantizedMatrix& q = m.quant;
  q = {};
  q.format = f;
  q.rows = m.rows;
  q.cols = m.cols;
  q.group_size = f == QuantFormat::fp8 ? m.cols : group;
  const int64_t G = q.groups();
  q.scales.resize(size_t(m.rows * G));
  if (f == QuantFormat::int4) q.mins.resize(q.scales.size());
  q.q.resize(size_t(f == QuantFormat::int4 ? m.rows * m.cols / 2 : m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t g = 0; g < G; ++g) {
      float* x = m.data.data() + r * m.cols + g * q.group_size;
      float lo = x[0], hi = x[0], amax = 0;
      for (int64_t i = 0; i < q.group_size; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
        amax = std::max(amax, std::fabs(x[i]));
      }
      const size_t gi = size_t(r * G + g);
      for (int64_t i = 0; i < q.group_size; ++i) {
        const int64_t k = g * q.group_size + i;
        if (f == QuantFormat::int8) {
          const float s = amax / 127;
          const int v = s > 0 ? int(std::nearbyint(x[i] / s)) : 0;
          q.scales[gi] = s;
          q.q[size_t(r * m.cols + k)] = uint8_t(int8_t(v));
          x[i] = float(v) * s;
        } else if (f == QuantFormat::int4) {
          const float s = (hi - lo) / 15;
          const int v = s > 0 ? std::clamp(int(std::nearbyint((x[i] - lo) / s)), 0, 15) : 0;
          q.scales[gi] = s;
          q.mins[gi] = lo;
          uint8_t& byte = q.q[size_t((r * m.cols + k) / 2)];
          byte = uint8_t((k & 1) ? (byte & 0x0F) | (v << 4) : (byte & 0xF0) | v);
          x[i] = float(v) * s + lo;
        } else {
          const float s = amax / quant::kFp8E4M3Max;
          const uint8_t b = quant::f32_to_e4m3(s > 0 ? x[i] / s : 0.0f);
          q.scales[gi] = s;
          q.q[size_t(r * m.cols + k)] = b;
          x[i] = quant::e4m3_to_f32(b) * s;
        }
      }
    }
}

struct Variant {
  QuantFormat format;
  int64_t group;  // 0: per channel
  const char* name;
};

ModelConfig quant_config() {  // small_llama with an intermediate size that every format packs (768)
  ModelConfig c = small_llama();
  c.intermediate_size = 768;
  c.vocab_size = 777;
  return c;
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 131 + 7) % vocab);
  return t;
}

float top2_gap(std::span<const float> v) {
  std::vector<float> s(v.begin(), v.end());
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<>());
  return s[0] - s[1];
}

// Every layer's projections in the variant's format (the embedding, norms and head stay as they are).
void quantize_projections(ModelWeights& w, const Variant& v) {
  for (LayerWeights& L : w.layers)
    for (HostMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      quantize(*m, v.format, v.group ? v.group : m->cols);
}

class GpuQuantBackend : public testing::TestWithParam<Variant> {};

TEST_P(GpuQuantBackend, LogitsAndTop1MatchCpu) {
  KILN_REQUIRE_GPU();
  const Variant v = GetParam();
  ModelConfig c = quant_config();
  ModelWeights w = random_weights(c, 42, 0.08f);
  quantize_projections(w, v);
  ThreadPool pool(2);
  CpuBackend cpu(c, w, pool);
  CudaBackend gpu(c, w, CudaBackendOptions{80, true});  // max_chunk 80: 37 tokens in one chunk, 100 in two
  const double tol = v.format == QuantFormat::fp8 ? kTolLogitsFp8 : kTolLogits;
  for (int64_t n : {37, 100}) {  // 100: the int8/int4 products take the dequantize + GEMM path (M > 64)
    auto cs = cpu.new_sequence(160);
    auto gs = gpu.new_sequence(160);
    auto p = prompt(n, c.vocab_size);
    std::vector<float> lc, lg;
    cpu.forward(*cs, p, true, lc);
    gpu.forward(*gs, p, true, lg);
    const double e = rel_error(lg, lc);
    std::printf("[ quant    ] %s prefill %lld: logits rel. error %.4f\n", v.name, static_cast<long long>(n), e);
    EXPECT_LT(e, tol) << "prefill " << n;
    int top1_checked = 0, top1_same = 0;
    for (int step = 0; step < 8; ++step) {
      int32_t t = int32_t((step * 17 + 3) % c.vocab_size);
      cpu.forward(*cs, std::span<const int32_t>(&t, 1), false, lc);
      gpu.forward(*gs, std::span<const int32_t>(&t, 1), false, lg);
      const double ed = rel_error(lg, lc);
      EXPECT_LT(ed, tol) << "decode step " << step;
      const int32_t ac = int32_t(std::max_element(lc.begin(), lc.end()) - lc.begin());
      const int32_t ag = int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
      // A top-2 gap of more than 4x the logits' RMS difference cannot be flipped by that noise.
      double rms = 0;
      for (size_t i = 0; i < lc.size(); ++i) rms += double(lg[i] - lc[i]) * (lg[i] - lc[i]);
      rms = std::sqrt(rms / double(lc.size()));
      if (top2_gap(lc) > 4 * rms) {
        ++top1_checked;
        top1_same += ac == ag;
        EXPECT_EQ(ac, ag) << "decode step " << step;
      }
    }
    std::printf("[ quant    ] %s decode: top-1 agrees on %d of %d clear steps\n", v.name, top1_same, top1_checked);
  }
}

// The fused decode GEMVs with int8 / int4 weights (qgemv_rope_kv, qgemv_swiglu: RoPE with the K/V
// write or SwiGLU in qgemv v3's epilogue) against the unfused qgemv + rope_qkv / silu_mul: the same
// bits at every decode step (replayed from CUDA graphs, as in production; the last step profiled to
// see the fused kernels ran), for full and partial rotation (the unrotated tail passes through),
// interleaved RoPE with a qkv bias (Qwen2's), and at hidden 4096 (the Llama shapes' K: 32
// super-chunks a row, so more than one per warp). fp8 has no fused form (the backend keeps it
// unfused).
TEST_P(GpuQuantBackend, FusedDecodeMatchesUnfusedBitForBit) {
  KILN_REQUIRE_GPU();
  const Variant v = GetParam();
  if (v.format == QuantFormat::fp8) GTEST_SKIP() << "fp8 has no fused decode GEMVs";
  struct Case {
    int64_t hidden;
    bool partial, interleaved_with_bias;
  };
  for (const Case k : {Case{256, false, false}, Case{256, true, false}, Case{256, false, true}, Case{4096, false, false}}) {
    SCOPED_TRACE(testing::Message() << "hidden " << k.hidden << (k.partial ? ", partial rotation" : "")
                                    << (k.interleaved_with_bias ? ", interleaved RoPE, qkv bias" : ""));
    ModelConfig c = quant_config();
    c.hidden_size = k.hidden;
    if (k.partial) c.rope.rot_dim = 32;
    if (k.interleaved_with_bias) {
      c.rope.style = RopeStyle::interleaved;
      c.qkv_bias = true;
    }
    ModelWeights w = random_weights(c, 43, 0.08f);
    quantize_projections(w, v);
    CudaBackendOptions on, off, folded;
    on.norm_fold = false;  // the folded norm rounds differently: compared within tolerance below
    off.fused_decode = false;
    CudaBackend a(c, w, on), b(c, w, off), f(c, w, folded);
    auto sf = f.new_sequence(300);  // > 256 positions: the decode attention has its combine, the step folds
    // <= 256 positions: folded too with int8 / int4 o and down, o + norm releasing gate/up at its exit
    // (NormFoldRule; session 46)
    auto sfs = f.new_sequence(200);
    auto sa = a.new_sequence(200), sb = b.new_sequence(200);
    auto p = prompt(70, c.vocab_size);  // past one 64-position attention tile
    std::vector<float> la, lb;
    std::vector<float> lf, lfs;
    a.forward(*sa, p, false, la);
    b.forward(*sb, p, false, lb);
    f.forward(*sf, p, false, lf);
    f.forward(*sfs, p, false, lfs);
    ASSERT_EQ(la, lb) << "prefill (never fused)";
    ASSERT_EQ(lf, lb) << "prefill (never folded)";
    ASSERT_EQ(lfs, lb) << "prefill (never folded), short cache";
    for (int step = 0; step < 10; ++step) {
      int32_t t = int32_t((step * 29 + 5) % c.vocab_size);
      if (step == 9) {  // graphs are bypassed while profiling
        a.set_profiling(true);
        f.set_profiling(true);
      }
      a.forward(*sa, std::span<const int32_t>(&t, 1), false, la);
      b.forward(*sb, std::span<const int32_t>(&t, 1), false, lb);
      f.forward(*sf, std::span<const int32_t>(&t, 1), false, lf);
      f.forward(*sfs, std::span<const int32_t>(&t, 1), false, lfs);
      ASSERT_EQ(la, lb) << "decode step " << step;
      // The RMSNorms folded into the GEMVs (gemv_fused.h) round differently: within tolerance.
      const double tol = v.format == QuantFormat::fp8 ? kTolLogitsFp8 : kTolLogits;
      EXPECT_LT(rel_error(lf, lb), tol) << "folded norm, decode step " << step;
      EXPECT_LT(rel_error(lfs, lb), tol) << "folded norm, short cache, decode step " << step;
    }
    bool rope_fused = false, swiglu_fused = false;  // the fused kernels did run
    for (const KernelStat& st : a.kernel_stats()) {
      rope_fused |= st.name.ends_with("qkv+rope.gemv");
      swiglu_fused |= st.name.ends_with("gate_up+silu.gemv");
    }
    EXPECT_TRUE(rope_fused && swiglu_fused) << v.name;
    int o_folded = 0;  // the int8 / int4 o GEMV took the fold, in both of f's profiled steps
    for (const KernelStat& st : f.kernel_stats())
      if (st.name.ends_with("o+norm.gemv")) o_folded += int(st.calls);
    EXPECT_EQ(o_folded, 2 * c.n_layers) << v.name;
  }
}

// The same with an int8 / fp8 KV cache (session 37: the fused qkv GEMV encodes each KV head's vector
// in the head's last block, RopeKvQuantEpi) against the plain qkv GEMV and the quantizing rope_qkv
// launch: the same bytes and scales, so the same logits, at both hidden sizes' K.
TEST_P(GpuQuantBackend, FusedDecodeIntoAQuantizedCacheMatchesUnfused) {
  KILN_REQUIRE_GPU();
  const Variant v = GetParam();
  if (v.format == QuantFormat::fp8) GTEST_SKIP() << "fp8 has no fused decode GEMVs";
  for (const int64_t hidden : {int64_t(256), int64_t(4096)})
    for (const KvCacheFormat kvf : {KvCacheFormat::int8, KvCacheFormat::fp8}) {
      SCOPED_TRACE(testing::Message() << "hidden " << hidden << ", " << kv_cache_format_name(kvf) << " cache");
      ModelConfig c = quant_config();
      c.hidden_size = hidden;
      ModelWeights w = random_weights(c, 45, 0.08f);
      quantize_projections(w, v);
      CudaBackendOptions on, off;
      on.norm_fold = false;
      off.fused_decode = false;
      CudaBackend a(c, w, on), b(c, w, off);
      a.set_kv_cache_format(kvf);
      b.set_kv_cache_format(kvf);
      auto sa = a.new_sequence(200), sb = b.new_sequence(200);
      bool rope_fused = false;
      ASSERT_NO_FATAL_FAILURE(
          decode_both_same_bits(a, b, *sa, *sb, prompt(70, c.vocab_size), 8, 31, 7, c.vocab_size, rope_fused));
      EXPECT_TRUE(rope_fused) << v.name;
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, GpuQuantBackend,
                         testing::Values(Variant{QuantFormat::int8, 0, "int8"}, Variant{QuantFormat::int8, 32, "int8_g32"},
                                         Variant{QuantFormat::int4, 128, "int4_g128"},
                                         Variant{QuantFormat::int4, 32, "int4_g32"}, Variant{QuantFormat::fp8, 0, "fp8"}),
                         [](const testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

// Random packed weights of every format generate and run (the speed runs' path): finite logits.
TEST(GpuQuantBackendRandom, EveryFormatRunsFinite) {
  KILN_REQUIRE_GPU();
  ModelConfig c = quant_config();
  for (QuantFormat f : {QuantFormat::int8, QuantFormat::int4, QuantFormat::fp8}) {
    auto b = CudaBackend::random(c, 7, 0.05f, CudaBackendOptions{64, true}, f);
    auto s = b->new_sequence(128);
    std::vector<float> logits;
    b->forward(*s, prompt(70, c.vocab_size), false, logits);
    for (int i = 0; i < 3; ++i) {
      int32_t t = 5;
      b->forward(*s, std::span<const int32_t>(&t, 1), false, logits);
    }
    bool finite = std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); });
    EXPECT_TRUE(finite) << "format " << int(f);
  }
}

}  // namespace
}  // namespace kiln::gputest
