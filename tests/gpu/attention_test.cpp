// Prefill and decode attention against cpu::attention on the same bf16-rounded q, k, v.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/attention.h"

namespace kiln::gputest {
namespace {

struct Case {
  int heads, kv_heads, d;
};
const Case kCases[] = {{4, 4, 64}, {8, 2, 80}, {7, 1, 96}, {8, 2, 128}, {12, 1, 128}, {14, 2, 64}, {20, 1, 64}};

// Whether impl is a tensor-core kernel of the right tile for head dim d ("wgmma-*" only for 64 and 128).
bool fast_impl(const std::string& impl, int d) {
  const std::string tile = d <= 64 ? "-d64" : "-d128";
  if (impl == "mma" + tile) return true;
  return impl == "wgmma" + tile && (d == 64 || d == 128);
}

// One prefill chunk against cpu::attention; q_offset shifts q (and out) by that many elements to
// force the unaligned fallback. version 0: the default dispatch (returns the kernel it selected);
// else that version through attention_prefill_version (returns "" when it cannot run the case).
std::string check_prefill(Case cs, int64_t n_q, int64_t q_start, int64_t q_offset = 0, int version = 0) {
  SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " n_q " << n_q
                                  << " q_start " << q_start << " q_offset " << q_offset << " version " << version);
  const int64_t n_kv = q_start + n_q, kv_dim = int64_t(cs.kv_heads) * cs.d;
  auto q = random_bf16_values(size_t(n_q * cs.heads * cs.d), 11, 2.0f);
  auto k = random_bf16_values(size_t(n_kv * kv_dim), 12, 2.0f);
  auto v = random_bf16_values(size_t(n_kv * kv_dim), 13);
  std::vector<float> ref(q.size());
  cpu::attention(q.data(), k.data(), v.data(), ref.data(), n_q, q_start, cs.heads, cs.kv_heads, cs.d);
  std::vector<float> q_padded(size_t(q_offset), 0.0f);
  q_padded.insert(q_padded.end(), q.begin(), q.end());
  auto dq = to_device_bf16(q_padded), dk = to_device_bf16(k), dv = to_device_bf16(v);
  DeviceBuffer<bf16> out(q_padded.size());
  out.poison();
  cuda::KvLayout kv{dk.data(), dv.data(), 0, kv_dim, cs.d};
  if (version == 0) {
    cuda::attention_prefill(dq.data() + q_offset, kv, out.data() + q_offset, n_q, q_start, cs.heads, cs.kv_heads,
                            cs.d, nullptr);
  } else if (!cuda::attention_prefill_version(version, dq.data() + q_offset, kv, out.data() + q_offset, n_q, q_start,
                                              cs.heads, cs.kv_heads, cs.d, nullptr)) {
    return "";
  }
  auto got = from_device_bf16(out);
  got.erase(got.begin(), got.begin() + q_offset);
  EXPECT_LT(rel_error(got, ref), kTolBf16Out);
  return version ? "ran" : cuda::attention_prefill_impl(dq.data() + q_offset, kv, out.data() + q_offset, cs.d);
}

TEST(GpuAttention, PrefillCausalGqaOddLengths) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases)
    for (auto [n_q, q_start] : {std::pair<int64_t, int64_t>{37, 0}, {37, 21}, {1, 70}, {100, 0}})
      EXPECT_TRUE(fast_impl(check_prefill(cs, n_q, q_start), cs.d));
}

// The tensor-core paths across tile edges: lengths not multiples of 64 or 128, q_start not a
// multiple of the tile (the diagonal crosses two K/V tiles), exact multiples, several query tiles.
const std::pair<int64_t, int64_t> kTileEdges[] = {{64, 0}, {65, 0},  {200, 93}, {130, 67}, {64, 64}, {257, 0},
                                                  {3, 190}, {127, 1}, {128, 0}, {129, 128}, {255, 1}, {300, 700}};

TEST(GpuAttention, PrefillTensorCoreTileEdges) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases)
    for (auto [n_q, q_start] : kTileEdges) EXPECT_TRUE(fast_impl(check_prefill(cs, n_q, q_start), cs.d));
}

// Version 2 (mma.sync) on purpose: the default on sm_90a is version 3 for head dims 64 and 128.
TEST(GpuAttention, PrefillMmaSyncVersion) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases)
    for (auto [n_q, q_start] : kTileEdges) EXPECT_EQ(check_prefill(cs, n_q, q_start, 0, 2), "ran");
}

// Versions 3 and 4 (wgmma, sm_90a) on purpose: odd lengths, chunked starts, GQA 1/4/12, head dims
// 64 and 128.
TEST(GpuAttention, PrefillWgmmaVersions) {
  KILN_REQUIRE_GPU();
  const Case cases[] = {{4, 4, 64}, {8, 2, 128}, {12, 1, 128}, {14, 2, 64}, {32, 8, 128}};
  if (check_prefill(cases[0], 37, 0, 0, 3).empty()) GTEST_SKIP() << "versions 3 and 4 need sm_90a";
  for (int version : {3, 4}) {
    for (Case cs : cases)
      for (auto [n_q, q_start] : kTileEdges) EXPECT_EQ(check_prefill(cs, n_q, q_start, 0, version), "ran");
    for (auto [n_q, q_start] : {std::pair<int64_t, int64_t>{1, 0}, {1, 1}, {37, 21}, {1000, 0}, {513, 1029}})
      EXPECT_EQ(check_prefill(Case{8, 2, 128}, n_q, q_start, 0, version), "ran");
    EXPECT_EQ(check_prefill(Case{8, 2, 64}, 1500, 3, 0, version), "ran");
    // Head dims 80 and 96 and unaligned pointers are not theirs.
    EXPECT_EQ(check_prefill(Case{8, 2, 96}, 37, 0, 0, version), "");
    EXPECT_EQ(check_prefill(Case{8, 2, 128}, 37, 0, 1, version), "");
  }
}

// A long sequence (4096 + 37 tokens, 32/8 heads, d 128): versions 3 and 4 against version 2 (all
// three are checked against the CPU above; here the wgmma pipelines run many tiles and blocks).
TEST(GpuAttention, PrefillWgmmaMatchesMmaLong) {
  KILN_REQUIRE_GPU();
  const int heads = 32, kv_heads = 8, d = 128;
  const int64_t n = 4096 + 37, kv_dim = kv_heads * d;
  auto dq = to_device_bf16(random_bf16_values(size_t(n * heads * d), 71, 2.0f));
  auto dk = to_device_bf16(random_bf16_values(size_t(n * kv_dim), 72, 2.0f));
  auto dv = to_device_bf16(random_bf16_values(size_t(n * kv_dim), 73));
  DeviceBuffer<bf16> o2(size_t(n * heads * d)), o3(o2.size());
  o2.poison();
  cuda::KvLayout kv{dk.data(), dv.data(), 0, kv_dim, d};
  ASSERT_TRUE(cuda::attention_prefill_version(2, dq.data(), kv, o2.data(), n, 0, heads, kv_heads, d, nullptr));
  const auto ref = from_device_bf16(o2);
  for (int version : {3, 4}) {
    o3.poison();
    if (!cuda::attention_prefill_version(version, dq.data(), kv, o3.data(), n, 0, heads, kv_heads, d, nullptr))
      GTEST_SKIP() << "versions 3 and 4 need sm_90a";
    EXPECT_LT(rel_error(from_device_bf16(o3), ref), 5e-3) << "version " << version;
  }
}

// q and out 2 bytes off 16-byte alignment: the fp32 fallback, same answers.
TEST(GpuAttention, PrefillUnalignedFallback) {
  KILN_REQUIRE_GPU();
  for (Case cs : {Case{8, 2, 128}, Case{7, 1, 96}, Case{4, 4, 64}})
    EXPECT_EQ(check_prefill(cs, 70, 13, 1), "fp32-fallback");
}

// One decode step of batch lens.size() (sequence b at position lens[b] - 1) against cpu::attention;
// the inputs and the reference are built once, run() launches with a given tuning and checks.
struct DecodeCase {
  Case cs;
  std::vector<int32_t> lens;
  int64_t capacity, batch;
  std::vector<float> ref;
  DeviceBuffer<bf16> dq, dk, dv;
  DeviceBuffer<int32_t> dlen;

  DecodeCase(Case c, std::vector<int32_t> lengths, int64_t cap)
      : cs(c), lens(std::move(lengths)), capacity(cap), batch(int64_t(lens.size())) {
    const int64_t kv_dim = int64_t(cs.kv_heads) * cs.d, q_row = int64_t(cs.heads) * cs.d;
    auto q = random_bf16_values(size_t(batch * q_row), 14, 2.0f);
    auto k = random_bf16_values(size_t(batch * capacity * kv_dim), 15, 2.0f);
    auto v = random_bf16_values(size_t(batch * capacity * kv_dim), 16);
    ref.resize(q.size());
    for (int64_t b = 0; b < batch; ++b)  // one query at position len-1 attends to 0..len-1
      cpu::attention(q.data() + b * q_row, k.data() + b * capacity * kv_dim, v.data() + b * capacity * kv_dim,
                     ref.data() + b * q_row, 1, lens[size_t(b)] - 1, cs.heads, cs.kv_heads, cs.d);
    dq = to_device_bf16(q);
    dk = to_device_bf16(k);
    dv = to_device_bf16(v);
    dlen = DeviceBuffer<int32_t>(lens);
  }

  cuda::KvLayout layout() const {
    const int64_t kv_dim = int64_t(cs.kv_heads) * cs.d;
    return cuda::KvLayout{dk.data(), dv.data(), capacity * kv_dim, kv_dim, cs.d};
  }

  // One launch with this tuning into `out` (workspace and output poisoned first).
  void launch(cuda::DecodeTuning tune, DeviceBuffer<bf16>& out) {
    DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(batch, cs.heads, cs.d, capacity)));
    ws.poison();
    out.poison();
    cuda::attention_decode_tuned(tune, dq.data(), layout(), dlen.data(), capacity, out.data(),
                                 cuda::decode_workspace(ws.data(), batch, cs.heads, cs.d, capacity), batch, cs.heads,
                                 cs.kv_heads, cs.d, nullptr);
  }

  // The outputs of a launch with this tuning (not checked).
  std::vector<float> outputs(cuda::DecodeTuning tune) {
    DeviceBuffer<bf16> out(ref.size());
    launch(tune, out);
    return from_device_bf16(out);
  }

  void run(cuda::DecodeTuning tune = {}) {
    SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " capacity "
                                    << capacity << " tuning " << tune.stages << "/" << tune.split_waves << "/"
                                    << tune.pdl << "/" << tune.interleave);
    DeviceBuffer<bf16> out(ref.size());
    launch(tune, out);
    EXPECT_LT(rel_error(from_device_bf16(out), ref), kTolBf16Out);
    EXPECT_STREQ(cuda::attention_decode_impl(dq.data(), layout(), out.data(), cs.d), cs.d <= 64 ? "mma-d64" : "mma-d128");
  }
};

void check_decode(Case cs, const std::vector<int32_t>& lens, int64_t capacity) { DecodeCase(cs, lens, capacity).run(); }

TEST(GpuAttention, DecodeBatchSplitsGqa) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases) check_decode(cs, {1, 37, 700}, 800);  // one split, a partial split, several
}

// Lengths around the tile and split edges, and a long one split many ways; the large capacity
// makes the grid wide, so most split blocks find no data and exit.
TEST(GpuAttention, DecodeLengthsAcrossSplits) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases) check_decode(cs, {1, 255, 257, 5000}, 5003);
  check_decode(Case{32, 8, 128}, {24, 64, 65}, 8192);
}

// Lengths 1..300 cycled over n sequences.
std::vector<int32_t> cycled_lengths(int n) {
  const int32_t pattern[] = {1, 37, 64, 65, 130, 255, 300};
  std::vector<int32_t> lens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) lens[size_t(i)] = pattern[i % 7];
  return lens;
}

// Batches with more (sequence, KV head) pairs than split blocks fit on the GPU get one split block
// each (P = 1): the streaming kernel (or the split kernel, for groups it does not serve) writes
// every output and the combine is not launched. 96 x 8 and
// 400 x 2 pairs are past the resident split blocks at d 128 / d 64 on an H200 (~264 / ~528).
TEST(GpuAttention, DecodeManySequencesOneSplitEach) {
  KILN_REQUIRE_GPU();
  check_decode(Case{32, 8, 128}, cycled_lengths(96), 320);
  check_decode(Case{8, 2, 64}, cycled_lengths(400), 320);
}

// The streaming kernel (attention_decode_stream.cu, the default at one split block per pair for
// groups of up to 8 query heads) against the split kernel it replaces: the same tiles and merge, so
// the same bits, for every head shape it serves; the reference check runs through run() for both.
TEST(GpuAttention, DecodeStreamEqualsTheSplitKernelBitwise) {
  KILN_REQUIRE_GPU();
  // 400 sequences: one split block per pair for every case on an H200 (>= 400 pairs); the groups of
  // 12 and 20 query heads keep the split kernel either way. {16, 2, 64}: a full 8-row q slot.
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back(Case{16, 2, 64});
  for (Case cs : cases) {
    SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d);
    DecodeCase c(cs, cycled_lengths(400), 320);
    cuda::DecodeTuning split;
    split.stream = 0;
    cuda::DecodeTuning stream;
    stream.stream = 1;
    stream.slices = 0;  // the slice kernel sums in another order (DecodeSlicesKernel)
    const std::vector<float> a = c.outputs(split), b = c.outputs(stream);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    c.run();  // the default (streaming where it applies) against the CPU reference
  }
}

// The streaming kernel's prologue choice (DecodeStreamPrologue): the first pair's K/V but its
// newest row loaded before the wait. It changes when loads are issued, not what lands in shared
// memory, so the outputs are the same bits. A batch-1-like step
// (few sequences, capacity <= 256: one split block per pair, first pairs of 1..2 tiles, the newest
// row at the start, middle and end of a tile) and 400 sequences (first pairs of 1..5 tiles).
TEST(GpuAttention, DecodeStreamPrologueChoicesBitwise) {
  KILN_REQUIRE_GPU();
  for (Case cs : {Case{32, 8, 128}, Case{8, 2, 64}, Case{16, 2, 64}, Case{4, 4, 128}}) {
    for (auto [lens, capacity] : {std::pair{std::vector<int32_t>{1, 37, 64, 65, 128}, int64_t(256)},
                                  std::pair{std::vector<int32_t>{2}, int64_t(128)},
                                  std::pair{cycled_lengths(400), int64_t(320)}}) {
      SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d << " batch "
                                      << lens.size());
      DecodeCase c(cs, lens, capacity);
      cuda::DecodeTuning plain;
      plain.stream = 1;
      plain.slices = 0;
      plain.early_rows = 0;
      const std::vector<float> a = c.outputs(plain);
      cuda::DecodeTuning early = plain;
      early.early_rows = 1;
      const std::vector<float> b = c.outputs(early);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
      c.run(early);
    }
  }
}

// The split kernel's early rows (the tile holding the newest position loaded before the wait but
// for that position): few sequences over a capacity past 256 (several splits a KV head, the newest
// position first, inside and last in its tile), every pipeline depth; the same bits as without.
TEST(GpuAttention, DecodeSplitEarlyRowsBitwise) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases) {
    DecodeCase c(cs, {1, 37, 64, 65, 255, 257, 700}, 800);
    for (int stages : {2, 3, 4}) {
      cuda::DecodeTuning plain{stages};
      plain.early_rows = 0;
      cuda::DecodeTuning early = plain;
      early.early_rows = 1;
      const std::vector<float> a = c.outputs(plain), b = c.outputs(early);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "stages " << stages;
      c.run(early);
    }
  }
}

// The slice kernel (attention_decode_slices.cu) forced at 400 sequences of lengths 1..300 on the
// contiguous layout, every head shape of the suite (the groups of 12 and 20 query heads keep the
// split kernel), against the CPU reference; and at 600 x 8 pairs, past kDecodeSlicesPairsPer8Warps
// pairs per 8 resident warps on an H200 (1056 warps), where the default takes it.
TEST(GpuAttention, DecodeSlicesKernel) {
  KILN_REQUIRE_GPU();
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back(Case{16, 2, 64});
  cuda::DecodeTuning slices;
  slices.slices = 1;
  for (Case cs : cases) DecodeCase(cs, cycled_lengths(400), 320).run(slices);
  check_decode(Case{32, 8, 128}, cycled_lengths(600), 320);
}

// Every tuning the kernel lab compares (stages 2/3/4, 1-4 waves of splits, combine with and without
// programmatic dependent launch, contiguous or interleaved tiles) computes the same function.
TEST(GpuAttention, DecodeTunings) {
  KILN_REQUIRE_GPU();
  DecodeCase big(Case{32, 8, 128}, {1, 64, 65, 255, 4097, 9000}, 9001), small(Case{8, 2, 64}, {1, 300, 5000}, 5003);
  for (int stages : {2, 3, 4})
    for (int waves : {1, 4})
      for (int pdl : {0, 1})
        for (int interleave : {0, 1}) {
          const cuda::DecodeTuning tune{stages, waves, pdl, interleave};
          big.run(tune);
          small.run(tune);
        }
}

}  // namespace
}  // namespace kiln::gputest
