// The quantized KV cache's kernels (kv_quant.h, attention_decode_q8) against host references:
//   * rope_qkv_quant: q bit-identical to rope_qkv's; V bytes and scales exactly those of the host
//     quantization of the same bf16 values (the CPU reference's quant::fake_quantize numerics);
//     K (quantized from the fp32 rotation) within one quantization step of rope_qkv's bf16 K;
//     contiguous (by position) and paged (by slot) writes;
//   * kv_dequantize: exactly the host's byte * scale rounded to bf16, contiguous and paged;
//   * attention_decode_q8: against cpu::attention on the dequantized K/V (what the CPU backend's
//     --kv-cache int8|fp8 attends to), contiguous and paged with shuffled blocks of 1, 16 and 64
//     positions, lengths on both sides of tile edges (1 .. 1029), GQA 1/4/7/8, head dims 64/80/128,
//     int8 and fp8. Tolerance kTolBf16Out (1e-2), the bf16 decode kernel's: the scales are applied
//     in fp32 and the bytes convert to bf16 exactly, so the only roundings are P (times the V scale)
//     and q to bf16, as in the bf16 kernel.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kv_quant.h"
#include "quant/fp8_e4m3.h"
#include "quant/quantize.h"

namespace kiln::gputest {
namespace {

using cuda::KvQuant;

// One (token, kv head) vector quantized as the CPU reference does: bytes, scale, dequantized values.
float host_quantize(KvQuant f, const float* x, int d, uint8_t* bytes, float* deq) {
  float amax = 0;
  for (int i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0) {
    std::fill_n(bytes, d, 0);
    std::fill_n(deq, d, 0.0f);
    return 0.0f;
  }
  const float scale = f == KvQuant::int8 ? amax / 127.0f : amax / quant::kFp8E4M3Max;
  const float inv = f == KvQuant::int8 ? 1.0f / scale : quant::kFp8E4M3Max / amax;
  for (int i = 0; i < d; ++i) {
    if (f == KvQuant::int8) {
      const int8_t q = int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
      bytes[i] = uint8_t(q);
      deq[i] = float(q) * scale;
    } else {
      bytes[i] = quant::f32_to_e4m3(x[i] * inv);
      deq[i] = quant::e4m3_to_f32(bytes[i]) * scale;
    }
  }
  return scale;
}

const char* name(KvQuant f) { return f == KvQuant::int8 ? "int8" : "fp8"; }

// A quantized cache on the host and its device image: contiguous (sequence b, position p at slot
// b * C + p) or paged (shuffled blocks of bs slots, one spare scratch block).
struct QCache {
  KvQuant f;
  int n_kv, d;
  bool paged;
  int64_t bs = 1, S = 0, C = 0, slots = 0, kv_dim;
  std::vector<int64_t> lens;
  std::vector<int32_t> table;
  std::vector<uint8_t> k8, v8;
  std::vector<float> ks, vs, kdeq, vdeq;  // bytes and scales in device order; dequantized (slots, kv_dim)
  DeviceBuffer<uint8_t> dk8, dv8;
  DeviceBuffer<float> dks, dvs;
  DeviceBuffer<int32_t> dtable;

  QCache(KvQuant f_, int n_kv_, int d_, std::vector<int64_t> lengths, bool paged_, int64_t block_size, uint32_t seed)
      : f(f_), n_kv(n_kv_), d(d_), paged(paged_), bs(block_size), kv_dim(int64_t(n_kv_) * d_), lens(std::move(lengths)) {
    std::mt19937 rng(seed);
    for (int64_t len : lens) C = std::max(C, len);
    if (paged) {
      int64_t needed = 0;
      for (int64_t len : lens) needed += (len + bs - 1) / bs, S = std::max(S, (len + bs - 1) / bs);
      const int64_t num_blocks = needed + 3;
      std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      table.assign(lens.size() * size_t(S), int32_t(num_blocks));  // unused entries: the scratch block
      size_t next = 0;
      for (size_t b = 0; b < lens.size(); ++b)
        for (int64_t i = 0; i < (lens[b] + bs - 1) / bs; ++i) table[b * size_t(S) + size_t(i)] = perm[next++];
      slots = (num_blocks + 1) * bs;
      dtable = DeviceBuffer<int32_t>(std::span<const int32_t>(table));
    } else {
      C = (C + 7) / 8 * 8 + 8;  // room past the longest sequence, never read
      slots = int64_t(lens.size()) * C;
    }
    k8.resize(size_t(slots * kv_dim));
    v8.resize(k8.size());
    kdeq.resize(k8.size());
    vdeq.resize(k8.size());
    ks.resize(size_t(slots * n_kv));
    vs.resize(ks.size());
    auto kraw = random_bf16_values(k8.size(), seed + 1, 2.0f), vraw = random_bf16_values(k8.size(), seed + 2);
    for (int64_t s = 0; s < slots; ++s)
      for (int h = 0; h < n_kv; ++h) {
        const size_t at = size_t(s * kv_dim + h * d), si = size_t(scale_index(s, h));
        if (s % 97 == 5) std::fill_n(kraw.begin() + at, d, 0.0f);  // an all-zero vector: scale 0
        ks[si] = host_quantize(f, &kraw[at], d, &k8[si * size_t(d)], &kdeq[at]);  // bytes head-major, as the scales
        vs[si] = host_quantize(f, &vraw[at], d, &v8[si * size_t(d)], &vdeq[at]);
      }
    dk8 = DeviceBuffer<uint8_t>(std::span<const uint8_t>(k8));
    dv8 = DeviceBuffer<uint8_t>(std::span<const uint8_t>(v8));
    dks = DeviceBuffer<float>(std::span<const float>(ks));
    dvs = DeviceBuffer<float>(std::span<const float>(vs));
  }
  int64_t slot_of(size_t b, int64_t p) const {
    return paged ? int64_t(table[b * size_t(S) + size_t(p / bs)]) * bs + p % bs : int64_t(b) * C + p;
  }
  int64_t scale_index(int64_t slot, int h) const {
    return paged ? h * slots + slot : (slot / C) * n_kv * C + h * C + slot % C;
  }
  std::vector<float> gather(const std::vector<float>& src, size_t b, int64_t len) const {
    std::vector<float> out(size_t(len * kv_dim));
    for (int64_t p = 0; p < len; ++p)
      std::copy_n(src.begin() + slot_of(b, p) * kv_dim, kv_dim, out.begin() + p * kv_dim);
    return out;
  }
  cuda::KvLayout layout() const {
    cuda::KvLayout kv{nullptr, nullptr, paged ? 0 : C * kv_dim, kv_dim, d};
    kv.quant = f;
    kv.k8 = dk8.data();
    kv.v8 = dv8.data();
    kv.k_scale = dks.data();
    kv.v_scale = dvs.data();
    kv.scale_seq_stride = paged ? 0 : n_kv * C;
    kv.scale_head_stride = paged ? slots : C;
    if (paged) {
      kv.block_table = dtable.data();
      kv.bt_stride = S;
      while ((int64_t(1) << kv.block_shift) < bs) ++kv.block_shift;
    }
    return kv;
  }
  int64_t max_kv_len() const { return paged ? S * bs : C; }
};

struct Case {
  int heads, kv_heads, d;
};

// version: attention_decode_q8_version's (0 the default dispatch, 4 the slice kernel forced).
void check_decode(KvQuant f, Case cs, const std::vector<int64_t>& lens, bool paged, int64_t bs, int version = 0) {
  SCOPED_TRACE(testing::Message() << name(f) << " heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d
                                  << (paged ? " paged, block_size " : " contiguous") << (paged ? bs : 0)
                                  << " version " << version);
  const QCache cache(f, cs.kv_heads, cs.d, lens, paged, bs, 31);
  const int64_t batch = int64_t(lens.size()), q_row = int64_t(cs.heads) * cs.d;
  auto q = random_bf16_values(size_t(batch * q_row), 32, 2.0f);
  std::vector<float> ref(q.size());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[size_t(b)];
    auto kb = cache.gather(cache.kdeq, size_t(b), len), vb = cache.gather(cache.vdeq, size_t(b), len);
    cpu::attention(q.data() + b * q_row, kb.data(), vb.data(), ref.data() + b * q_row, 1, len - 1, cs.heads,
                   cs.kv_heads, cs.d);
  }
  auto dq = to_device_bf16(q);
  std::vector<int32_t> lens32(lens.begin(), lens.end());
  DeviceBuffer<int32_t> dlen(lens32);
  const int64_t max_kv_len = cache.max_kv_len();
  DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(batch, cs.heads, cs.d, max_kv_len)));
  ws.poison();
  DeviceBuffer<bf16> out(q.size());
  out.poison();
  ASSERT_TRUE(cuda::attention_decode_q8_version(version, dq.data(), cache.layout(), dlen.data(), max_kv_len,
                                                out.data(),
                                                cuda::decode_workspace(ws.data(), batch, cs.heads, cs.d, max_kv_len),
                                                batch, cs.heads, cs.kv_heads, cs.d, nullptr));
  EXPECT_LT(rel_error(from_device_bf16(out), ref), kTolBf16Out);

  // kv_dequantize of the longest sequence: byte * scale rounded to bf16, exactly.
  const size_t b = size_t(std::max_element(lens.begin(), lens.end()) - lens.begin());
  const int64_t len = lens[b];
  DeviceBuffer<bf16> dk(size_t(len * cache.kv_dim)), dv(dk.size());
  cuda::kv_dequantize(cache.layout(), int64_t(b), len, cs.kv_heads, dk.data(), dv.data(), nullptr);
  auto kb = cache.gather(cache.kdeq, b, len), vb = cache.gather(cache.vdeq, b, len);
  for (float& x : kb) x = round_to_bf16(x);
  for (float& x : vb) x = round_to_bf16(x);
  EXPECT_EQ(from_device_bf16(dk), kb);
  EXPECT_EQ(from_device_bf16(dv), vb);
}

const Case kCases[] = {{32, 8, 128}, {14, 2, 64}, {8, 2, 80}, {4, 4, 128}, {7, 1, 128}};
const std::vector<int64_t> kLens = {1, 15, 16, 17, 100, 1029, 63, 64, 65};

TEST(GpuKvQuant, DecodeContiguousMatchesCpuOnDequantizedCache) {
  KILN_REQUIRE_GPU();
  for (KvQuant f : {KvQuant::int8, KvQuant::fp8})
    for (const Case& cs : kCases) check_decode(f, cs, kLens, false, 1);
}

TEST(GpuKvQuant, DecodePagedShuffledBlocksMatchesCpu) {
  KILN_REQUIRE_GPU();
  for (KvQuant f : {KvQuant::int8, KvQuant::fp8})
    for (const Case& cs : kCases) check_decode(f, cs, kLens, true, 16);
  check_decode(KvQuant::int8, {8, 2, 64}, {1, 5, 77, 300}, true, 1);
  check_decode(KvQuant::fp8, {32, 8, 128}, {64, 65, 700}, true, 64);
}

// Many sequences, one split block each (P = 1: the split kernel writes every output, no combine).
TEST(GpuKvQuant, DecodeManySequencesOneSplitEach) {
  KILN_REQUIRE_GPU();
  std::vector<int64_t> lens(96);
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = int64_t(1 + (i * 37) % 300);
  check_decode(KvQuant::int8, {32, 8, 128}, lens, true, 16);
  check_decode(KvQuant::fp8, {32, 8, 128}, lens, false, 1);
}

// The slice kernel (attention_decode_q8_slices.cu) forced, on every head shape it serves (group <= 8:
// all of kCases; version 4 its default configuration, 5 / 6 each), contiguous and paged (block sizes 16, 1 and 64: a slice in one block, in 16, in
// part of one), lengths across slice boundaries; then the default at 600 x 8 pairs (fp8: the slice
// kernel; int8: the split kernel until its slice step has passed here on a device), past
// kDecodeSlicesPairsPer8Warps per 8 resident warps.
TEST(GpuKvQuant, DecodeSliceKernelMatchesCpu) {
  KILN_REQUIRE_GPU();
  std::vector<int64_t> lens(40);
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = int64_t(1 + (i * 53) % 300);
  for (KvQuant f : {KvQuant::int8, KvQuant::fp8})
    for (const Case& cs : kCases) {
      check_decode(f, cs, kLens, false, 1, 4);
      check_decode(f, cs, lens, true, 16, 4);
    }
  check_decode(KvQuant::int8, {8, 2, 64}, {1, 5, 77, 300}, true, 1, 4);
  check_decode(KvQuant::fp8, {32, 8, 128}, {64, 65, 700, 3}, true, 64, 4);
  for (int variant_version : {5, 6})  // both configurations (slots a warp, blocks a SM), either default
    for (KvQuant f : {KvQuant::int8, KvQuant::fp8}) {
      check_decode(f, {32, 8, 128}, lens, true, 16, variant_version);
      check_decode(f, {14, 2, 64}, kLens, false, 1, variant_version);
    }
  check_decode(KvQuant::fp8, {32, 8, 128}, {4000}, false, 1, 4);  // one long pair a warp
  std::vector<int64_t> many(600);
  for (size_t i = 0; i < many.size(); ++i) many[i] = int64_t(129 + (i * 37) % 128);
  check_decode(KvQuant::fp8, {32, 8, 128}, many, true, 16);
  check_decode(KvQuant::int8, {32, 8, 128}, many, true, 16);
}

TEST(GpuKvQuant, DecodeLongSequenceManySplits) {  // 32k positions: split blocks and the combine
  KILN_REQUIRE_GPU();
  check_decode(KvQuant::int8, {32, 8, 128}, {32768 - 3}, false, 1);
  check_decode(KvQuant::fp8, {32, 8, 128}, {20001, 3}, true, 16);
}

// rope_qkv_quant against rope_qkv on the same qkv rows.
void check_write(KvQuant f, bool by_slot, int n_heads, int n_kv, int d, int rot_dim, bool interleaved) {
  SCOPED_TRACE(testing::Message() << name(f) << (by_slot ? " by slot" : " by position") << " heads " << n_heads
                                  << "/" << n_kv << " d " << d << " rot " << rot_dim);
  const std::vector<int32_t> pos = {0, 3, 17, 100, 511};
  const int64_t n = int64_t(pos.size()), cap = 512, kv_dim = int64_t(n_kv) * d, q_dim = int64_t(n_heads) * d;
  const int64_t row = q_dim + 2 * kv_dim;
  auto qkv = random_bf16_values(size_t(n * row), 41, 1.5f);
  std::vector<float> inv(size_t(rot_dim / 2));
  for (int i = 0; i < rot_dim / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(rot_dim));
  DeviceBuffer<float> dinv(inv);
  auto dqkv = to_device_bf16(qkv);
  DeviceBuffer<int32_t> dpos(pos);
  // The bf16 path: q and K/V into a contiguous bf16 cache.
  DeviceBuffer<bf16> q_ref(size_t(n * q_dim)), kc(size_t(cap * kv_dim)), vc(kc.size());
  cuda::rope_qkv(dqkv.data(), dpos.data(), nullptr, n, dinv.data(), rot_dim, interleaved, n_heads, n_kv, d,
                 q_ref.data(), cuda::KvLayout{kc.data(), vc.data(), cap * kv_dim, kv_dim, d}, nullptr);
  // The quantized path: by position into a contiguous layout, or by (scattered) slot into a pool.
  const int64_t slots = cap;
  std::vector<int32_t> slot(pos.size());
  for (size_t t = 0; t < pos.size(); ++t) slot[t] = by_slot ? int32_t((pos[t] * 7 + 11) % slots) : pos[t];
  DeviceBuffer<int32_t> dslot(slot);
  DeviceBuffer<uint8_t> k8(size_t(slots * kv_dim)), v8(k8.size());
  DeviceBuffer<float> ks(size_t(slots * n_kv)), vs(ks.size());
  k8.zero(), v8.zero(), ks.zero(), vs.zero();
  DeviceBuffer<bf16> q_out(q_ref.size());
  cuda::KvLayout kv{nullptr, nullptr, by_slot ? 0 : slots * kv_dim, kv_dim, d};
  kv.quant = f;
  kv.k8 = k8.data(), kv.v8 = v8.data(), kv.k_scale = ks.data(), kv.v_scale = vs.data();
  kv.scale_seq_stride = by_slot ? 0 : n_kv * slots;
  kv.scale_head_stride = slots;
  cuda::rope_qkv_quant(dqkv.data(), dpos.data(), by_slot ? dslot.data() : nullptr, n, dinv.data(), rot_dim,
                       interleaved, n_heads, n_kv, d, q_out.data(), kv, nullptr);
  EXPECT_EQ(from_device_bf16(q_out), from_device_bf16(q_ref)) << "q as rope_qkv writes it";
  const auto hk8 = k8.to_host(), hv8 = v8.to_host();
  const auto hks = ks.to_host(), hvs = vs.to_host();
  const auto kref = from_device_bf16(kc);
  std::vector<float> kgot, kwant;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int h = 0; h < n_kv; ++h) {
      const size_t si = size_t(h * slots + slot[t]), at = si * size_t(d);  // head-major bytes
      // V: the bf16 values of qkv, quantized exactly as the host does.
      std::vector<uint8_t> bytes(static_cast<size_t>(d));
      std::vector<float> deq(static_cast<size_t>(d));
      const float vscale = host_quantize(f, &qkv[size_t(int64_t(t) * row + q_dim + kv_dim + h * d)], d, bytes.data(),
                                         deq.data());
      EXPECT_EQ(hvs[si], vscale);
      std::vector<float> fq(deq.size());  // the values the CPU backend's store_format leaves
      std::copy_n(&qkv[size_t(int64_t(t) * row + q_dim + kv_dim + h * d)], d, fq.begin());
      quant::fake_quantize(f == KvQuant::int8 ? QuantFormat::int8 : QuantFormat::fp8, fq.data(), 1, d);
      EXPECT_EQ(fq, deq);
      EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), hv8.begin() + at)) << "V bytes, token " << t << " head " << h;
      // K: within a quantization step of rope_qkv's bf16 K.
      for (int i = 0; i < d; ++i) {
        const uint8_t b = hk8[at + size_t(i)];
        kgot.push_back((f == KvQuant::int8 ? float(int8_t(b)) : quant::e4m3_to_f32(b)) * hks[si]);
        kwant.push_back(kref[size_t(pos[t] * kv_dim + h * d + i)]);
      }
    }
  EXPECT_LT(rel_error(kgot, kwant), f == KvQuant::int8 ? 1e-2 : 6e-2);
}

TEST(GpuKvQuant, RopeQkvQuantWritesHostQuantization) {
  KILN_REQUIRE_GPU();
  for (KvQuant f : {KvQuant::int8, KvQuant::fp8})
    for (bool by_slot : {false, true}) {
      check_write(f, by_slot, 8, 2, 64, 64, false);
      check_write(f, by_slot, 4, 4, 128, 64, true);  // partial rotation, interleaved
      check_write(f, by_slot, 14, 2, 80, 80, false);
    }
}

// rope_qkv_quant_vec (kv_quant_vec.cu: 16 bytes a thread, a head's amax over its threads) against
// rope_qkv_quant's per-token kernel on the same rows: q, bytes and scales the same bits; 300 tokens
// with scattered positions (past the 256-entry cos/sin table too), by position and by slot,
// halves and interleaved RoPE, head dims 64 and 128, both formats; refused where a head's threads
// would straddle a warp.
void check_write_vec(KvQuant f, bool by_slot, int n_heads, int n_kv, int d, bool interleaved) {
  SCOPED_TRACE(testing::Message() << name(f) << (by_slot ? " by slot" : " by position") << " heads " << n_heads
                                  << "/" << n_kv << " d " << d << (interleaved ? " interleaved" : " halves"));
  const int64_t n = 300, cap = 4096, kv_dim = int64_t(n_kv) * d, q_dim = int64_t(n_heads) * d;
  std::vector<int32_t> pos(static_cast<size_t>(n)), slot(pos.size());
  for (size_t t = 0; t < pos.size(); ++t) {
    pos[t] = int32_t((t * 13 + 5) % size_t(cap));
    slot[t] = int32_t((t * 7 + 11) % size_t(cap));
  }
  auto qkv = random_bf16_values(size_t(n * (q_dim + 2 * kv_dim)), 43, 2.0f);
  for (size_t i = 0; i < qkv.size(); i += 997) qkv[i] = 0.0f;
  std::vector<float> inv(size_t(d / 2));
  for (int i = 0; i < d / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(d));
  DeviceBuffer<float> dinv(inv);
  DeviceBuffer<float2> cos_sin(size_t(256 * d / 2));
  cuda::rope_table_fill(cos_sin.data(), 256, dinv.data(), d, nullptr);
  auto dqkv = to_device_bf16(qkv);
  DeviceBuffer<int32_t> dpos(pos), dslot(slot);
  struct Out {
    DeviceBuffer<uint8_t> k8, v8;
    DeviceBuffer<float> ks, vs;
    DeviceBuffer<bf16> q;
    cuda::KvLayout kv;
  };
  auto make = [&] {
    Out o{DeviceBuffer<uint8_t>(size_t(cap * kv_dim)), DeviceBuffer<uint8_t>(size_t(cap * kv_dim)),
          DeviceBuffer<float>(size_t(cap * n_kv)), DeviceBuffer<float>(size_t(cap * n_kv)),
          DeviceBuffer<bf16>(size_t(n * q_dim)), cuda::KvLayout{nullptr, nullptr, by_slot ? 0 : cap * kv_dim, kv_dim, d}};
    o.k8.zero(), o.v8.zero(), o.ks.zero(), o.vs.zero();
    o.kv.quant = f;
    o.kv.k8 = o.k8.data(), o.kv.v8 = o.v8.data(), o.kv.k_scale = o.ks.data(), o.kv.v_scale = o.vs.data();
    o.kv.scale_seq_stride = by_slot ? 0 : n_kv * cap;
    o.kv.scale_head_stride = cap;
    return o;
  };
  Out ref = make(), got = make();
  const int32_t* slots = by_slot ? dslot.data() : nullptr;
  // By slot the layout is a pool: rope_qkv_quant writes it through slots (a block table is only read).
  cuda::rope_qkv_quant(dqkv.data(), dpos.data(), slots, n, dinv.data(), d, interleaved, n_heads, n_kv, d, ref.q.data(),
                       ref.kv, nullptr, cos_sin.data(), 256);
  ASSERT_TRUE(cuda::rope_qkv_quant_vec(dqkv.data(), dpos.data(), slots, n, dinv.data(), d, interleaved, n_heads, n_kv,
                                       d, got.q.data(), got.kv, nullptr, cos_sin.data(), 256));
  EXPECT_EQ(got.q.to_host(), ref.q.to_host());
  EXPECT_EQ(got.k8.to_host(), ref.k8.to_host());
  EXPECT_EQ(got.v8.to_host(), ref.v8.to_host());
  EXPECT_EQ(got.ks.to_host(), ref.ks.to_host());
  EXPECT_EQ(got.vs.to_host(), ref.vs.to_host());
}

TEST(GpuKvQuant, RopeQkvQuantVecEqualsPerTokenKernel) {
  KILN_REQUIRE_GPU();
  for (KvQuant f : {KvQuant::int8, KvQuant::fp8})
    for (bool by_slot : {false, true})
      for (bool interleaved : {false, true}) {
        check_write_vec(f, by_slot, 32, 8, 128, interleaved);  // Llama-3-8B's heads
        check_write_vec(f, by_slot, 8, 8, 64, interleaved);
      }
  // 12 + 4 heads of 64 with halves: 64 + 32 items a token, V's 8-thread groups from item 64; 7 + 1
  // heads of 128 with halves: 64 + 16 = 80 items, not a multiple of 32: refused.
  check_write_vec(KvQuant::fp8, true, 12, 4, 64, false);
  DeviceBuffer<bf16> qkv(size_t(64 * 9 * 128)), q(size_t(64 * 7 * 128));
  DeviceBuffer<int32_t> p(std::vector<int32_t>(64, 0));
  DeviceBuffer<float> inv(64);
  DeviceBuffer<uint8_t> b8(size_t(64 * 128));
  DeviceBuffer<float> sc(64);
  cuda::KvLayout kv{nullptr, nullptr, 64 * 128, 128, 128};
  kv.quant = KvQuant::fp8, kv.k8 = kv.v8 = b8.data(), kv.k_scale = kv.v_scale = sc.data();
  kv.scale_seq_stride = 64, kv.scale_head_stride = 64;
  EXPECT_FALSE(cuda::rope_qkv_quant_vec(qkv.data(), p.data(), nullptr, 64, inv.data(), 128, false, 7, 1, 128, q.data(),
                                        kv, nullptr));
}

TEST(GpuKvQuant, RefusesWhatItCannotRun) {
  KILN_REQUIRE_GPU();
  EXPECT_FALSE(cuda::kv_quant_supported(72));
  EXPECT_TRUE(cuda::kv_quant_supported(80));
  const QCache cache(KvQuant::int8, 2, 64, {10}, false, 1, 3);
  DeviceBuffer<bf16> q(256), out(256);
  DeviceBuffer<int32_t> len(std::vector<int32_t>{10});
  DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(1, 4, 64, 16)));
  cuda::KvLayout bf16_layout = cache.layout();
  bf16_layout.quant = KvQuant::none;  // a bf16 layout handed to the quantized kernel
  EXPECT_ANY_THROW(cuda::attention_decode_q8(q.data(), bf16_layout, len.data(), 16, out.data(),
                                             cuda::decode_workspace(ws.data(), 1, 4, 64, 16), 1, 4, 2, 64, nullptr));
  EXPECT_ANY_THROW(cuda::attention_prefill(q.data(), cache.layout(), out.data(), 1, 0, 4, 2, 64, nullptr));
}

}  // namespace
}  // namespace kiln::gputest
