// CpuBackend::forward_batch: many sequences in one step over a paged pool, with shuffled
// (non-contiguous) block tables, give exactly what forward() gives each sequence alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "expect_error.h"
#include "tiny_model.h"

namespace kiln {
namespace {

using test::expect_error;

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> table;
};

TEST(CpuBatch, MixedStepsOverShuffledBlocksMatchEachSequenceAlone) {
  ThreadPool threads(2);
  auto backend = test::tiny_backend(threads);
  const int32_t bs = 4, n_blocks = 64;
  auto pool = backend->new_kv_pool(n_blocks, bs);
  std::mt19937 rng(3);
  std::vector<int32_t> free_blocks(n_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  // Four sequences of lengths 1, 7, 16, 23: prefilled in chunks over three steps, then decoded.
  const std::vector<int> lengths = {1, 7, 16, 23};
  std::vector<Seq> seqs(lengths.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int i = 0; i < lengths[s] + 3; ++i) seqs[s].tokens.push_back(int32_t(rng() % 97));
    for (int b = 0; b < (lengths[s] + 3 + bs - 1) / bs; ++b) {
      seqs[s].table.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
  }
  // Expected: each sequence alone, all positions' logits.
  std::vector<std::vector<float>> alone(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    auto seq = backend->new_sequence(64);
    backend->forward(*seq, seqs[s].tokens, true, alone[s]);
  }
  const size_t vocab = 97;
  // Step plan: chunk boundaries per sequence; each step runs [done, done + chunk).
  std::vector<int64_t> done(seqs.size(), 0);
  for (int step = 0; step < 8; ++step) {
    std::vector<BatchEntry> entries;
    std::vector<size_t> which;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t total = int64_t(seqs[s].tokens.size());
      if (done[s] >= total) continue;
      const int64_t chunk = std::min<int64_t>(total - done[s], step < 2 ? 5 + int64_t(s) : 1);
      entries.push_back({std::span(seqs[s].tokens).subspan(size_t(done[s]), size_t(chunk)), done[s], seqs[s].table,
                         true});
      which.push_back(s);
      done[s] += chunk;
    }
    if (entries.empty()) break;
    std::vector<float> logits;
    backend->forward_batch(*pool, entries, logits);
    ASSERT_EQ(logits.size(), entries.size() * vocab);
    for (size_t e = 0; e < entries.size(); ++e) {
      const size_t s = which[e];
      const size_t last = size_t(done[s] - 1);
      const std::vector<float> want(alone[s].begin() + ptrdiff_t(last * vocab),
                                    alone[s].begin() + ptrdiff_t((last + 1) * vocab));
      const std::vector<float> got(logits.begin() + ptrdiff_t(e * vocab), logits.begin() + ptrdiff_t((e + 1) * vocab));
      // The same arithmetic in the same order: bit-identical, not merely close.
      EXPECT_EQ(got, want) << "step " << step << " sequence " << s << " position " << last;
    }
  }
}

TEST(CpuBatch, LogitsOnlyForEntriesThatWantThem) {
  ThreadPool threads(1);
  auto backend = test::tiny_backend(threads);
  auto pool = backend->new_kv_pool(8, 4);
  const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5}, ta = {0}, tb = {1};
  const std::vector<BatchEntry> entries = {{a, 0, ta, false}, {b, 0, tb, true}};
  std::vector<float> logits;
  backend->forward_batch(*pool, entries, logits);
  EXPECT_EQ(logits.size(), 97u);
}

TEST(CpuBatch, BadEntriesAreRejectedBeforeAnyWork) {
  ThreadPool threads(1);
  auto backend = test::tiny_backend(threads);
  auto pool = backend->new_kv_pool(4, 4);
  std::vector<float> logits;
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5}, one_block = {0}, two_blocks = {0, 1}, outside = {9, 1};
  expect_error([&] { backend->forward_batch(*pool, std::vector<BatchEntry>{{toks, 0, one_block, true}}, logits); },
               "cannot hold positions", Errc::invalid_argument);
  expect_error([&] { backend->forward_batch(*pool, std::vector<BatchEntry>{{toks, 0, outside, true}}, logits); },
               "outside the pool", Errc::invalid_argument);
  const std::vector<int32_t> bad = {1, 500};
  expect_error([&] { backend->forward_batch(*pool, std::vector<BatchEntry>{{bad, 0, one_block, true}}, logits); },
               "outside the vocabulary", Errc::invalid_argument);
  expect_error(
      [&] {
        backend->forward_batch(*pool, std::vector<BatchEntry>{{toks, 0, two_blocks, true}, {toks, 0, two_blocks, true}},
                               logits);
      },
      "write KV slot", Errc::invalid_argument);
  expect_error([&] { backend->forward_batch(*pool, std::vector<BatchEntry>{}, logits); }, "at least one entry",
               Errc::invalid_argument);
}

}  // namespace
}  // namespace kiln
