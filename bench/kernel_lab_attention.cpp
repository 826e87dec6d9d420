// The kernel lab's attention benches: decode (flash-decoding tunings, paged vs contiguous, batch
// and length sweeps) and prefill (mma.sync and wgmma versions), each validated against the fp32
// reference path before it is timed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "kernel_lab.h"
#include "paged_kv_pool.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/random_fill.h"
#include "profile/cost_model.h"

namespace kiln::lab {

using namespace kiln::cuda;

namespace {
// Prefill FLOPs as FlashAttention counts causal attention: 2 products of 2 S^2 H d, halved.
double causal_flops(int64_t n, int heads, int d) { return 4.0 * double(n) * double(n) / 2 * heads * d; }

// The quantized cache's decode (attention_decode_q8, session 5) on the bf16 bench's K/V copies
// quantized per (position, KV head); validated against the bf16 kernel's output on the unquantized
// values (so the error shown is the quantization's); GB/s on the bytes read (1 a value, 4 a scale).
void bench_decode_q8(KvQuant f, const std::vector<DeviceBuffer<bf16>>& ks, const std::vector<DeviceBuffer<bf16>>& vs,
                     int64_t batch, int64_t len, int heads, int kv_heads, int d, const DeviceBuffer<bf16>& q,
                     const DeviceBuffer<int32_t>& dlen, DecodeWorkspace wsv, const std::vector<float>& ref,
                     const char* shape, double copy_gbs) {
  const int64_t kv_dim = int64_t(kv_heads) * d, elems = batch * len * kv_dim, n_scales = batch * len * kv_heads;
  const size_t copies = ks.size();
  std::vector<DeviceBuffer<uint8_t>> k8, v8;
  std::vector<DeviceBuffer<float>> sc;
  std::vector<KvLayout> lay;
  for (size_t i = 0; i < copies; ++i) {
    k8.emplace_back(size_t(elems));
    v8.emplace_back(size_t(elems));
    sc.emplace_back(size_t(2 * n_scales));
    KvLayout kv{nullptr, nullptr, len * kv_dim, kv_dim, d};
    kv.quant = f;
    kv.k8 = k8.back().data();
    kv.v8 = v8.back().data();
    kv.k_scale = sc.back().data();
    kv.v_scale = sc.back().data() + n_scales;
    kv.scale_seq_stride = int64_t(kv_heads) * len;
    kv.scale_head_stride = len;
    kv_quantize(ks[i].data(), batch, len, kv_heads, kv, false, nullptr);
    kv_quantize(vs[i].data(), batch, len, kv_heads, kv, true, nullptr);
    lay.push_back(kv);
  }
  DeviceBuffer<bf16> out(q.size());
  auto run = [&](size_t i) {
    attention_decode_q8(q.data(), lay[i % copies], dlen.data(), len, out.data(), wsv, batch, heads, kv_heads, d, nullptr);
  };
  run(0);
  cuda_synchronize();
  const double err = rel_error(to_float(out), ref);
  const bool i8 = f == KvQuant::int8;
  if (!(err < (i8 ? 2e-2 : 8e-2))) std::printf("VALIDATION FAILED: decode q8 %s err %.3e\n", shape, err);
  const double bytes = 2.0 * double(elems) + 2.0 * double(n_scales) * 4, flops = 4.0 * batch * len * heads * d;
  const double ms = time_ms([&](int i) { run(size_t(i)); });
  record("attention", shape, i8 ? "q8-int8" : "q8-fp8", ms, bytes, flops, copy_gbs, err);
  for (int v : {1, 2, 3, 5, 6}) {  // each version (attention_decode_q8.cu; 5, 6 the slice kernel's), validated the same way
    if (!i8 && v < 5) continue;
    auto run_v = [&](size_t i) {
      return attention_decode_q8_version(v, q.data(), lay[i % copies], dlen.data(), len, out.data(), wsv, batch, heads,
                                         kv_heads, d, nullptr);
    };
    out.poison();
    if (!run_v(0)) continue;
    cuda_synchronize();
    const double err_v = rel_error(to_float(out), ref);
    if (!(err_v < (i8 ? 2e-2 : 8e-2))) std::printf("VALIDATION FAILED: decode q8 v%d %s err %.3e\n", v, shape, err_v);
    const std::string label = std::string(i8 ? "q8-int8 " : "q8-fp8 ") +
                              (v == 5 ? "slices s4b2" : v == 6 ? "slices s3b3" : version_label(v));
    record("attention", shape, label, time_ms([&](int i) { run_v(size_t(i)); }), bytes, flops, copy_gbs, err_v);
  }
  if (i8) {
    const double ms10 = time_ms([&](int i) {
      for (int j = 0; j < 10; ++j) run(size_t(10 * i + j));
    }, 20, 2) / 10;
    record("attention", shape, "q8-int8 x10", ms10, bytes, flops, copy_gbs, err);
  }
}
}  // namespace

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

// Paged decode at the continuous-batching engine's shape: many sequences, short contexts (2048 x
// 128 in / 128 out: 128..256 positions), one split block per (sequence, KV head). "kiln" is the
// default; "stream" the streaming kernel (session 14, attention_decode_stream.cu), "slices" the
// slice kernel (session 16, attention_decode_slices.cu; the default from 7 pairs per
// 8 resident warps), each forced; 143 and 207 positions are the engine's profile lengths (a partial last tile
// of 64); "split" the split kernel the streaming kernel replaced,
// and that kernel's tunings (2 stages with 3 blocks per SM, 4 stages, no PDL). "L=128..256": the
// lengths rising with the sequence index, as the engine's admission order leaves them.
// `kernel_lab --attention-batch` runs only this.
void bench_decode_batched(double copy_gbs) {
  const int heads = 32, kv_heads = 8, d = 128;
  const int64_t kv_dim = kv_heads * d;
  for (auto [batch, len] :
       {std::pair<int64_t, int64_t>{2048, 128}, {2048, 192}, {2048, 256}, {2048, 143}, {2048, 207}, {1024, 192},
        {512, 192}, {2048, -256}, {64, 128}, {64, 512}, {96, 512}, {128, 512}, {256, 512}, {64, 2048}}) {
    const bool ramp = len < 0;  // lengths 128..256 over the batch
    len = std::abs(len);
    const ShuffledPagedKv pool(batch, len, kv_dim, d, 9, 11);
    const KvLayout& paged = pool.layout;
    DeviceBuffer<bf16> q(size_t(batch * heads * d)), out(q.size()), out_ref(q.size());
    fill_random_bf16(q.data(), int64_t(q.size()), 9, 2, 0, 1.0f, nullptr);
    std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(len));
    if (ramp)
      for (int64_t i = 0; i < batch; ++i) lens[size_t(i)] = int32_t(len / 2 + i * (len / 2) / batch + 1);
    int64_t positions = 0;
    for (int32_t l : lens) positions += l;
    DeviceBuffer<int32_t> dlen(lens);
    const int64_t cap = 4096;  // the engine plans the split count from its capacity, not the length
    DeviceBuffer<float> ws(size_t(decode_workspace_floats(batch, heads, d, cap)));
    auto wsv = decode_workspace(ws.data(), batch, heads, d, cap);
    attention_decode(q.data(), paged, dlen.data(), cap, out_ref.data(), wsv, batch, heads, kv_heads, d, nullptr);
    cuda_synchronize();
    const std::vector<float> ref = to_float(out_ref);
    const double bytes = 2.0 * positions * kv_dim * 2, flops = 4.0 * positions * heads * d;
    char shape[64];
    std::snprintf(shape, sizeof shape, "paged decode b=%lld L=%s%lld", (long long)batch, ramp ? "129.." : "",
                  (long long)len);
    for (const DecodeVariant& var : {DecodeVariant{"kiln", {}}, DecodeVariant{"stream", {0, 0, -1, -1, -1, 1, 0}},
                                     DecodeVariant{"slices", {0, 0, -1, -1, -1, 1, 1}},
                                     DecodeVariant{"split", {0, 0, -1, -1, -1, 0}},
                                     DecodeVariant{"s2", {2, 0, -1, -1, -1, 0}},
                                     DecodeVariant{"s4", {4, 0, -1, -1, -1, 0}},
                                     DecodeVariant{"s3nopdl", {3, 0, -1, -1, 0, 0}}}) {
      out.poison();
      attention_decode_tuned(var.tune, q.data(), paged, dlen.data(), cap, out.data(), wsv, batch, heads, kv_heads, d,
                             nullptr);
      cuda_synchronize();
      const double err = rel_error(to_float(out), ref);
      if (!(err < 1e-2)) std::printf("VALIDATION FAILED: paged decode %s %s err %.3e\n", var.label, shape, err);
      const double ms = time_ms([&](int) {
        attention_decode_tuned(var.tune, q.data(), paged, dlen.data(), cap, out.data(), wsv, batch, heads, kv_heads,
                               d, nullptr);
      });
      record("attention", shape, var.label, ms, bytes, flops, copy_gbs, err);
    }
    // The 8-bit caches (session 23): the default, the split kernel (version 2) and the slice kernel's
    // two configurations (versions 5, 6) forced; validated against the bf16 output (the error is the quantization's); GB/s
    // on the bytes read (1 a value, 4 a scale).
    const double q8_bytes = 2.0 * positions * kv_dim + 2.0 * positions * kv_heads * 4;
    for (KvQuant f : {KvQuant::fp8, KvQuant::int8}) {
      const QuantizedPagedKv qpool(pool, f, kv_heads, d);
      const bool i8 = f == KvQuant::int8;
      for (auto [label, version] : {std::pair<const char*, int>{"kiln", 0}, {"split", 2}, {"slices s4b2", 5}, {"slices s3b3", 6}}) {
        auto run = [&] {
          return attention_decode_q8_version(version, q.data(), qpool.layout, dlen.data(), cap, out.data(), wsv, batch,
                                             heads, kv_heads, d, nullptr);
        };
        out.poison();
        if (!run()) continue;
        cuda_synchronize();
        const double err = rel_error(to_float(out), ref);
        const std::string name = std::string(i8 ? "q8-int8 " : "q8-fp8 ") + label;
        if (!(err < (i8 ? 2e-2 : 8e-2)))
          std::printf("VALIDATION FAILED: paged decode %s %s err %.3e\n", name.c_str(), shape, err);
        record("attention", shape, name, time_ms([&](int) { run(); }), q8_bytes, flops, copy_gbs, err);
      }
    }
  }
}

void bench_attention(double copy_gbs) {
  const int heads = 32, kv_heads = 8, d = 128;
  const int64_t kv_dim = kv_heads * d;
  // Contiguous decode: every tuning, validated against the default's output; GB/s on K/V bytes.
  // K/V copies rotate through more than 4x the L2 (b=1 L=8k is 34 MB). "kiln x10": the default's
  // per-call time in a run of 10 back-to-back calls (launch latency overlapped, as in a decode step
  // where attention follows other kernels), next to the single call between two events.
  for (auto [batch, len] :
       {std::pair<int64_t, int64_t>{1, 32768}, {64, 2048}, {1, 8192}, {1, 512}, {1, 2048}, {256, 512}}) {
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
    for (KvQuant f : {KvQuant::int8, KvQuant::fp8})
      bench_decode_q8(f, ks, vs, batch, len, heads, kv_heads, d, q, dlen, wsv, ref, shape, copy_gbs);
  }
  // Paged decode: the same shapes over a pool of 16-token blocks in shuffled order (what the
  // continuous-batching engine reads), validated bit for bit against the contiguous kernel on the
  // same values gathered into per-sequence caches; GB/s counts K/V bytes read (block tables aside).
  for (auto [batch, len] : {std::pair<int64_t, int64_t>{1, 32768}, {64, 2048}, {16, 8192}, {256, 512}}) {
    const ShuffledPagedKv pool(batch, len, kv_dim, d, 5, 7);
    const KvLayout& paged = pool.layout;
    const int64_t bs = ShuffledPagedKv::kBlock;
    DeviceBuffer<bf16> ck(size_t(batch * len * kv_dim)), cv(ck.size());
    DeviceBuffer<bf16> q(size_t(batch * heads * d)), out(q.size()), out_ref(q.size());
    fill_random_bf16(q.data(), int64_t(q.size()), 5, 2, 0, 1.0f, nullptr);
    const int64_t block_bytes = bs * kv_dim * 2;
    for (int64_t i = 0; i < pool.num_blocks; ++i) {  // sequence i / per_seq, block i % per_seq
      const int64_t src = int64_t(pool.table[size_t(i)]) * bs * kv_dim;
      copy_device(ck.data() + i * bs * kv_dim, pool.k.data() + src, block_bytes, nullptr);
      copy_device(cv.data() + i * bs * kv_dim, pool.v.data() + src, block_bytes, nullptr);
    }
    std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(len));
    DeviceBuffer<int32_t> dlen(lens);
    DeviceBuffer<float> ws(size_t(decode_workspace_floats(batch, heads, d, len)));
    auto wsv = decode_workspace(ws.data(), batch, heads, d, len);
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
  bench_decode_batched(copy_gbs);
  {  // paged prefill (version 2: the engine's chunked prefill), one 4096-token sequence over shuffled 16-token blocks
    const int64_t n = 4096;
    const ShuffledPagedKv pool(1, n, kv_dim, d, 6, 8);
    const KvLayout& paged = pool.layout;
    DeviceBuffer<bf16> q(size_t(n * heads * d)), out(q.size());
    fill_random_bf16(q.data(), int64_t(q.size()), 6, 2, 0, 1.0f, nullptr);
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
                                             : version_label(version);
      record("attention", shape, label, ms, bytes, flops, copy_gbs, err);
    }
  }
}

}  // namespace kiln::lab
