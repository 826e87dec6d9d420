// Paged decode and prefill attention (the paged form of kv_layout.h) against cpu::attention on
// each sequence's K/V gathered contiguously on the host. Block tables are shuffled (a sequence's
// blocks are scattered over the pool, in no order), lengths sit on both sides of block and tile
// edges (1, 15, 16, 17, 63, 64, 65, 100, 1029), GQA ratios 1/4/7, head dims 64 and 128, block
// sizes 1, 16 and 64. Also: paged == contiguous bit for bit when the table maps a sequence onto
// the contiguous layout (paging changes only the row addresses), and the fp32 fallback kernels
// read the paged layout too.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"
#include "kernels/cuda/attention.h"
#include "kiln/error.h"

namespace kiln::gputest {
namespace {

struct Case {
  int heads, kv_heads, d;
};

// A pool of num_blocks + 1 blocks of random K/V (block num_blocks: scratch) and one block-table
// row per sequence, S ids wide: sequence b's blocks are drawn from a shuffled permutation of the
// pool, and the entries past its last block hold other (valid) ids, which must never be read.
struct PagedKv {
  int64_t bs = 0, kv_dim = 0, num_blocks = 0, S = 0;
  std::vector<int64_t> lens;
  std::vector<float> k, v;      // ((num_blocks + 1) * bs, kv_dim)
  std::vector<int32_t> table;   // (n_seq, S)
  DeviceBuffer<bf16> dk, dv;
  DeviceBuffer<int32_t> dtable;

  PagedKv(std::vector<int64_t> lengths, int64_t block_size, int64_t kv_dim_, uint32_t seed, bool identity = false)
      : bs(block_size), kv_dim(kv_dim_), lens(std::move(lengths)) {
    int64_t needed = 0;
    for (int64_t len : lens) {
      needed += (len + bs - 1) / bs;
      S = std::max(S, (len + bs - 1) / bs);
    }
    S += identity ? 0 : 1;  // a spare column of unused ids
    num_blocks = identity ? int64_t(lens.size()) * S : needed + 5;
    std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(seed);
    if (!identity) std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(lens.size() * size_t(S), 0);
    size_t next = 0;
    for (size_t b = 0; b < lens.size(); ++b) {
      const int64_t used = identity ? S : (lens[b] + bs - 1) / bs;
      for (int64_t i = 0; i < S; ++i)
        table[b * size_t(S) + size_t(i)] =
            i < used ? perm[next++] : int32_t(std::uniform_int_distribution<int64_t>(0, num_blocks)(rng));
    }
    const size_t rows = size_t((num_blocks + 1) * bs);
    k = random_bf16_values(rows * size_t(kv_dim), seed + 1, 2.0f);
    v = random_bf16_values(rows * size_t(kv_dim), seed + 2);
    dk = to_device_bf16(k);
    dv = to_device_bf16(v);
    dtable = DeviceBuffer<int32_t>(std::span<const int32_t>(table));
  }

  // Sequence b's first len positions of `src` as contiguous (len, kv_dim) rows.
  std::vector<float> gather(const std::vector<float>& src, size_t b, int64_t len) const {
    std::vector<float> out(size_t(len * kv_dim));
    for (int64_t p = 0; p < len; ++p) {
      const int64_t slot = int64_t(table[b * size_t(S) + size_t(p / bs)]) * bs + p % bs;
      std::copy_n(src.begin() + slot * kv_dim, kv_dim, out.begin() + p * kv_dim);
    }
    return out;
  }

  cuda::KvLayout layout(int d) const {
    cuda::KvLayout kv{dk.data(), dv.data(), 0, kv_dim, d};
    kv.block_table = dtable.data();
    kv.bt_stride = S;
    while ((int64_t(1) << kv.block_shift) < bs) ++kv.block_shift;
    return kv;
  }
};

// Decode of one query per sequence (sequence b at position lens[b] - 1); q_offset shifts q and out
// off 16-byte alignment (the fp32 fallback). Returns the paged output.
// `tune`: the stages / splits / PDL choices the kernel lab compares (default: the engine's).
std::vector<float> check_decode(Case cs, const std::vector<int64_t>& lens, int64_t bs, int64_t q_offset = 0,
                                cuda::DecodeTuning tune = {}) {
  SCOPED_TRACE(testing::Message() << "decode heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d
                                  << " block_size " << bs << " q_offset " << q_offset << " stages " << tune.stages);
  const int64_t batch = int64_t(lens.size()), kv_dim = int64_t(cs.kv_heads) * cs.d, q_row = int64_t(cs.heads) * cs.d;
  PagedKv pkv(lens, bs, kv_dim, 21);
  auto q = random_bf16_values(size_t(batch * q_row), 22, 2.0f);
  std::vector<float> ref(q.size());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[size_t(b)];
    auto kb = pkv.gather(pkv.k, size_t(b), len), vb = pkv.gather(pkv.v, size_t(b), len);
    cpu::attention(q.data() + b * q_row, kb.data(), vb.data(), ref.data() + b * q_row, 1, len - 1, cs.heads,
                   cs.kv_heads, cs.d);
  }
  std::vector<float> q_padded(size_t(q_offset), 0.0f);
  q_padded.insert(q_padded.end(), q.begin(), q.end());
  auto dq = to_device_bf16(q_padded);
  std::vector<int32_t> lens32(lens.begin(), lens.end());
  DeviceBuffer<int32_t> dlen(lens32);
  const int64_t max_kv_len = pkv.S * bs;
  DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(batch, cs.heads, cs.d, max_kv_len)));
  ws.poison();
  DeviceBuffer<bf16> out(q_padded.size());
  out.poison();
  const cuda::KvLayout kv = pkv.layout(cs.d);
  cuda::attention_decode_tuned(tune, dq.data() + q_offset, kv, dlen.data(), max_kv_len, out.data() + q_offset,
                               cuda::decode_workspace(ws.data(), batch, cs.heads, cs.d, max_kv_len), batch, cs.heads,
                               cs.kv_heads, cs.d, nullptr);
  auto got = from_device_bf16(out);
  got.erase(got.begin(), got.begin() + q_offset);
  EXPECT_LT(rel_error(got, ref), kTolBf16Out);
  const std::string impl = cuda::attention_decode_impl(dq.data() + q_offset, kv, out.data() + q_offset, cs.d);
  EXPECT_EQ(impl, q_offset ? "fp32-fallback" : cs.d <= 64 ? "mma-d64" : "mma-d128");
  return got;
}

const Case kCases[] = {{8, 2, 64}, {4, 4, 128}, {14, 2, 64}, {32, 8, 128}, {7, 1, 128}};
const std::vector<int64_t> kDecodeLens = {1, 15, 16, 17, 100, 1029, 63, 64, 65};

TEST(GpuPagedAttention, DecodeShuffledBlocksOddLengths) {
  KILN_REQUIRE_GPU();
  for (Case cs : kCases) check_decode(cs, kDecodeLens, 16);
}

// Many sequences, one split block each (P = 1: the streaming kernel where it applies, no combine
// launch), as the batching engine runs its large decode steps.
TEST(GpuPagedAttention, DecodeManySequencesOneSplitEach) {
  KILN_REQUIRE_GPU();
  std::vector<int64_t> lens(96);
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = kDecodeLens[i % kDecodeLens.size()];
  check_decode(Case{32, 8, 128}, lens, 16);
}

// The slice kernel (attention_decode_slices.cu: a K/V stream per warp in 16-position slices, the
// default from several pairs per resident warp on) forced at batches of one split block per pair:
// odd lengths around the slice and block edges, block sizes below, at and above the slice, every
// head shape of the suite it serves; then paged against contiguous bit for bit, as the other
// kernels (an identity table makes the pool the contiguous layout).
TEST(GpuPagedAttention, DecodeSlicesKernel) {
  KILN_REQUIRE_GPU();
  cuda::DecodeTuning slices;
  slices.slices = 1;
  std::vector<int64_t> many(400);
  for (size_t i = 0; i < many.size(); ++i) many[i] = kDecodeLens[i % kDecodeLens.size()];
  for (Case cs : kCases) check_decode(cs, many, 16, 0, slices);
  for (int64_t bs : {1, 8, 32}) check_decode(Case{32, 8, 128}, many, bs, 0, slices);
  for (Case cs : {Case{8, 2, 64}, Case{32, 8, 128}}) {
    const int64_t bs = 16, kv_dim = int64_t(cs.kv_heads) * cs.d, batch = int64_t(many.size());
    PagedKv pkv(many, bs, kv_dim, 33, /*identity=*/true);
    const int64_t capacity = pkv.S * bs;
    auto dq = to_device_bf16(random_bf16_values(size_t(batch * cs.heads * cs.d), 34, 2.0f));
    std::vector<int32_t> lens32(many.begin(), many.end());
    DeviceBuffer<int32_t> dlen(lens32);
    DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(batch, cs.heads, cs.d, capacity)));
    DeviceBuffer<bf16> out_paged(size_t(batch * cs.heads * cs.d)), out_contig(out_paged.size());
    auto wsv = cuda::decode_workspace(ws.data(), batch, cs.heads, cs.d, capacity);
    cuda::attention_decode_tuned(slices, dq.data(), pkv.layout(cs.d), dlen.data(), capacity, out_paged.data(), wsv,
                                 batch, cs.heads, cs.kv_heads, cs.d, nullptr);
    cuda::KvLayout contig{pkv.dk.data(), pkv.dv.data(), capacity * kv_dim, kv_dim, cs.d};
    cuda::attention_decode_tuned(slices, dq.data(), contig, dlen.data(), capacity, out_contig.data(), wsv, batch,
                                 cs.heads, cs.kv_heads, cs.d, nullptr);
    EXPECT_EQ(from_device_bf16(out_paged), from_device_bf16(out_contig)) << "d " << cs.d;
  }
}

// The decode kernels with the K/V of the newest position's tile but that position loaded before
// the wait (DecodeStreamPrologue::early_rows) through shuffled block tables: the newest row's block
// looked up on its own, block sizes below, at and above the tile; few sequences at capacity <= 256
// (the streaming kernel, first pairs of 1..2 tiles), many (streaming), and few over a longer
// capacity (the split kernel, several splits a KV head).
TEST(GpuPagedAttention, DecodeEarlyRows) {
  KILN_REQUIRE_GPU();
  cuda::DecodeTuning early;
  early.stream = 1;
  early.slices = 0;
  early.early_rows = 1;
  std::vector<int64_t> many(96);
  for (size_t i = 0; i < many.size(); ++i) many[i] = kDecodeLens[i % kDecodeLens.size()];
  for (int64_t bs : {1, 16, 128}) {
    for (Case cs : {Case{32, 8, 128}, Case{8, 2, 64}}) {
      const auto a = check_decode(cs, {1, 15, 16, 17, 63, 64, 65, 100}, bs, 0, early);
      cuda::DecodeTuning plain = early;
      plain.early_rows = 0;
      EXPECT_EQ(a, check_decode(cs, {1, 15, 16, 17, 63, 64, 65, 100}, bs, 0, plain));
    }
    check_decode(Case{32, 8, 128}, many, bs, 0, early);
    for (Case cs : kCases) check_decode(cs, kDecodeLens, bs, 0, early);
  }
}

// The paged kernel's other pipeline depths (2 and 4 stages, instantiated for d 128 for the kernel
// lab and KILN_ATTN_DECODE_STAGES), few sequences (several splits) and many (one split each).
TEST(GpuPagedAttention, DecodeStages) {
  KILN_REQUIRE_GPU();
  std::vector<int64_t> many(96);
  for (size_t i = 0; i < many.size(); ++i) many[i] = kDecodeLens[i % kDecodeLens.size()];
  for (int stages : {2, 4}) {
    check_decode(Case{32, 8, 128}, kDecodeLens, 16, 0, cuda::DecodeTuning{stages});
    check_decode(Case{7, 1, 128}, many, 16, 0, cuda::DecodeTuning{stages});
  }
}

TEST(GpuPagedAttention, DecodeBlockSizes) {
  KILN_REQUIRE_GPU();
  for (int64_t bs : {1, 8, 64, 128}) check_decode(Case{8, 2, 128}, {1, 17, 65, 300, 2050}, bs);
}

TEST(GpuPagedAttention, DecodeUnalignedFallback) {
  KILN_REQUIRE_GPU();
  for (Case cs : {Case{8, 2, 64}, Case{4, 4, 128}}) check_decode(cs, {1, 16, 17, 300}, 16, 1);
}

// With the table mapping sequence b onto blocks b * S .. b * S + S - 1 the pool IS the contiguous
// (batch, capacity, kv_dim) layout: the paged and contiguous kernels must agree bit for bit.
TEST(GpuPagedAttention, DecodePagedEqualsContiguousBitwise) {
  KILN_REQUIRE_GPU();
  for (Case cs : {Case{8, 2, 64}, Case{32, 8, 128}}) {
    const std::vector<int64_t> lens = {1, 17, 700, 64};
    const int64_t bs = 16, kv_dim = int64_t(cs.kv_heads) * cs.d, batch = 4;
    PagedKv pkv(lens, bs, kv_dim, 31, /*identity=*/true);
    const int64_t capacity = pkv.S * bs;
    auto q = random_bf16_values(size_t(batch * cs.heads * cs.d), 32, 2.0f);
    auto dq = to_device_bf16(q);
    std::vector<int32_t> lens32(lens.begin(), lens.end());
    DeviceBuffer<int32_t> dlen(lens32);
    DeviceBuffer<float> ws(size_t(cuda::decode_workspace_floats(batch, cs.heads, cs.d, capacity)));
    DeviceBuffer<bf16> out_paged(q.size()), out_contig(q.size());
    auto wsv = cuda::decode_workspace(ws.data(), batch, cs.heads, cs.d, capacity);
    cuda::attention_decode(dq.data(), pkv.layout(cs.d), dlen.data(), capacity, out_paged.data(), wsv, batch, cs.heads,
                           cs.kv_heads, cs.d, nullptr);
    cuda::KvLayout contig{pkv.dk.data(), pkv.dv.data(), capacity * kv_dim, kv_dim, cs.d};
    cuda::attention_decode(dq.data(), contig, dlen.data(), capacity, out_contig.data(), wsv, batch, cs.heads,
                           cs.kv_heads, cs.d, nullptr);
    EXPECT_EQ(from_device_bf16(out_paged), from_device_bf16(out_contig)) << "d " << cs.d;
  }
}

// Prefill chunks (n_q, q_start) of several sequences sharing one pool; chunk j reads table row j
// through kv_row_view. q_offset: the unaligned fp32 fallback.
void check_prefill(Case cs, const std::vector<std::pair<int64_t, int64_t>>& chunks, int64_t bs,
                   int64_t q_offset = 0) {
  SCOPED_TRACE(testing::Message() << "prefill heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d
                                  << " block_size " << bs << " q_offset " << q_offset);
  const int64_t kv_dim = int64_t(cs.kv_heads) * cs.d, q_row = int64_t(cs.heads) * cs.d;
  std::vector<int64_t> lens;
  for (auto [n_q, q_start] : chunks) lens.push_back(n_q + q_start);
  PagedKv pkv(lens, bs, kv_dim, 41);
  const cuda::KvLayout kv = pkv.layout(cs.d);
  for (size_t j = 0; j < chunks.size(); ++j) {
    const auto [n_q, q_start] = chunks[j];
    SCOPED_TRACE(testing::Message() << "n_q " << n_q << " q_start " << q_start);
    auto q = random_bf16_values(size_t(n_q * q_row), 42 + uint32_t(j), 2.0f);
    auto kb = pkv.gather(pkv.k, j, lens[j]), vb = pkv.gather(pkv.v, j, lens[j]);
    std::vector<float> ref(q.size());
    cpu::attention(q.data(), kb.data(), vb.data(), ref.data(), n_q, q_start, cs.heads, cs.kv_heads, cs.d);
    std::vector<float> q_padded(size_t(q_offset), 0.0f);
    q_padded.insert(q_padded.end(), q.begin(), q.end());
    auto dq = to_device_bf16(q_padded);
    DeviceBuffer<bf16> out(q_padded.size());
    out.poison();
    const cuda::KvLayout row = cuda::kv_row_view(kv, int64_t(j));
    cuda::attention_prefill(dq.data() + q_offset, row, out.data() + q_offset, n_q, q_start, cs.heads, cs.kv_heads,
                            cs.d, nullptr);
    auto got = from_device_bf16(out);
    got.erase(got.begin(), got.begin() + q_offset);
    EXPECT_LT(rel_error(got, ref), kTolBf16Out);
    // Paged K/V is version 2's (mma.sync) on every GPU: version 3 reads contiguous K/V only.
    const std::string impl = cuda::attention_prefill_impl(dq.data() + q_offset, row, out.data() + q_offset, cs.d);
    EXPECT_EQ(impl, q_offset ? "fp32-fallback" : cs.d <= 64 ? "mma-d64" : "mma-d128");
  }
}

TEST(GpuPagedAttention, PrefillShuffledBlocksOddLengths) {
  KILN_REQUIRE_GPU();
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{1, 0},   {15, 0},  {16, 0},  {17, 0},   {100, 0}, {37, 63},
                                                           {64, 17}, {3, 190}, {65, 64}, {1029, 0}, {50, 1000}};
  for (Case cs : {Case{8, 2, 64}, Case{4, 4, 128}, Case{14, 2, 64}, Case{7, 1, 128}}) check_prefill(cs, chunks, 16);
}

TEST(GpuPagedAttention, PrefillBlockSizesAndFallback) {
  KILN_REQUIRE_GPU();
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{1, 0}, {17, 0}, {100, 29}, {130, 67}};
  for (int64_t bs : {1, 8, 64, 128}) check_prefill(Case{8, 2, 128}, chunks, bs);
  check_prefill(Case{8, 2, 64}, chunks, 16, 1);
  check_prefill(Case{4, 4, 128}, chunks, 16, 1);
}

TEST(GpuPagedAttention, PrefillPagedEqualsContiguousBitwise) {
  KILN_REQUIRE_GPU();
  for (Case cs : {Case{8, 2, 64}, Case{4, 4, 128}}) {
    const int64_t bs = 16, kv_dim = int64_t(cs.kv_heads) * cs.d, n_q = 150, q_start = 37;
    PagedKv pkv({n_q + q_start}, bs, kv_dim, 51, /*identity=*/true);
    auto q = random_bf16_values(size_t(n_q * cs.heads * cs.d), 52, 2.0f);
    auto dq = to_device_bf16(q);
    DeviceBuffer<bf16> out_paged(q.size()), out_contig(q.size());
    cuda::attention_prefill(dq.data(), pkv.layout(cs.d), out_paged.data(), n_q, q_start, cs.heads, cs.kv_heads, cs.d,
                            nullptr);
    cuda::KvLayout contig{pkv.dk.data(), pkv.dv.data(), 0, kv_dim, cs.d};
    // Version 2 on both layouts (the contiguous default is version 3 on sm_90a).
    ASSERT_TRUE(cuda::attention_prefill_version(2, dq.data(), contig, out_contig.data(), n_q, q_start, cs.heads,
                                                cs.kv_heads, cs.d, nullptr));
    EXPECT_EQ(from_device_bf16(out_paged), from_device_bf16(out_contig)) << "d " << cs.d;
  }
}

TEST(GpuPagedAttention, RejectsBadPagedLayout) {
  KILN_REQUIRE_GPU();
  PagedKv pkv({20}, 16, 128, 61);
  cuda::KvLayout kv = pkv.layout(64);
  kv.bt_stride = 0;  // a paged layout without a table width
  auto q = to_device_bf16(random_bf16_values(size_t(20 * 4 * 64), 62));
  DeviceBuffer<bf16> out(q.size());
  EXPECT_THROW(cuda::attention_prefill(q.data(), kv, out.data(), 20, 0, 4, 2, 64, nullptr), Error);
}

// The varlen launch (every chunk's query tiles in one grid, in any order) must give each chunk
// exactly what its own launch gives: the same tiles run the same code.
TEST(GpuPagedAttention, PrefillVarlenEqualsPerChunkLaunchesBitwise) {
  KILN_REQUIRE_GPU();
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{128, 0}, {1, 0}, {65, 63}, {3, 190}, {200, 17}, {64, 0}};
  for (Case cs : {Case{8, 2, 64}, Case{32, 8, 128}, Case{7, 1, 128}}) {
    SCOPED_TRACE(testing::Message() << "heads " << cs.heads << "/" << cs.kv_heads << " d " << cs.d);
    const int64_t kv_dim = int64_t(cs.kv_heads) * cs.d, q_row = int64_t(cs.heads) * cs.d;
    std::vector<int64_t> lens, row0;
    int64_t M = 0;
    for (auto [n_q, q_start] : chunks) {
      lens.push_back(n_q + q_start);
      row0.push_back(M);
      M += n_q;
    }
    PagedKv pkv(lens, 16, kv_dim, 61);
    const cuda::KvLayout kv = pkv.layout(cs.d);
    auto dq = to_device_bf16(random_bf16_values(size_t(M * q_row), 62, 2.0f));
    DeviceBuffer<bf16> out_chunks(size_t(M * q_row)), out_varlen(size_t(M * q_row));
    out_chunks.poison();
    out_varlen.poison();
    std::vector<cuda::PrefillTile> tiles;
    for (size_t j = 0; j < chunks.size(); ++j) {
      const auto [n_q, q_start] = chunks[j];
      cuda::attention_prefill(dq.data() + row0[j] * q_row, cuda::kv_row_view(kv, int64_t(j)),
                              out_chunks.data() + row0[j] * q_row, n_q, q_start, cs.heads, cs.kv_heads, cs.d, nullptr);
      for (int64_t q0 = 0; q0 < n_q; q0 += cuda::kPrefillTileRows)
        tiles.push_back({int32_t(row0[j] + q0), int32_t(n_q - q0), int32_t(q_start + q0), int32_t(j)});
    }
    std::reverse(tiles.begin(), tiles.end());  // any order
    ASSERT_EQ(tiles.size(), 2u + 1 + 2 + 1 + 4 + 1);
    DeviceBuffer<int32_t> dtiles(std::span<const int32_t>(reinterpret_cast<const int32_t*>(tiles.data()), 4 * tiles.size()));
    ASSERT_TRUE(cuda::attention_prefill_varlen_ok(dq.data(), kv, out_varlen.data(), cs.d));
    cuda::attention_prefill_varlen(dq.data(), kv, out_varlen.data(),
                                   reinterpret_cast<const cuda::PrefillTile*>(dtiles.data()), int64_t(tiles.size()),
                                   cs.heads, cs.kv_heads, cs.d, nullptr);
    EXPECT_EQ(from_device_bf16(out_varlen), from_device_bf16(out_chunks));
  }
}

TEST(GpuPagedAttention, PrefillVarlenNeedsPagedAlignedInputs) {
  KILN_REQUIRE_GPU();
  PagedKv pkv({100}, 16, 2 * 64, 71);
  auto dq = to_device_bf16(random_bf16_values(size_t(100 * 8 * 64), 72));
  DeviceBuffer<bf16> out(size_t(100 * 8 * 64));
  const cuda::KvLayout kv = pkv.layout(64);
  EXPECT_TRUE(cuda::attention_prefill_varlen_ok(dq.data(), kv, out.data(), 64));
  EXPECT_FALSE(cuda::attention_prefill_varlen_ok(dq.data() + 1, kv, out.data(), 64));  // unaligned q
  cuda::KvLayout contig{pkv.dk.data(), pkv.dv.data(), 0, 2 * 64, 64};
  EXPECT_FALSE(cuda::attention_prefill_varlen_ok(dq.data(), contig, out.data(), 64));  // contiguous K/V
}

}  // namespace
}  // namespace kiln::gputest
