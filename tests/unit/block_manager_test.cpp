#include "runtime/block_manager.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "expect_error.h"

namespace kiln {
namespace {

using test::expect_error;

// Free blocks + distinct blocks held by any table == the pool, recounted from the outside.
void expect_exact_accounting(const BlockManager& blocks, const std::set<SeqId>& live) {
  std::set<int32_t> used;
  for (SeqId seq : live)
    for (int32_t block : blocks.block_table(seq)) used.insert(block);
  EXPECT_EQ(blocks.num_free_blocks() + int32_t(used.size()), blocks.num_blocks());
  EXPECT_EQ(blocks.num_used_blocks(), int32_t(used.size()));
  EXPECT_EQ(blocks.num_sequences(), live.size());
  blocks.check_invariants();
}

TEST(BlockManager, RejectsEmptyPoolOrBlocks) {
  expect_error([] { BlockManager(0, 16); }, "at least one block", Errc::invalid_argument);
  expect_error([] { BlockManager(8, 0); }, "block size", Errc::invalid_argument);
}

TEST(BlockManager, BlocksForTokensRoundsUp) {
  BlockManager blocks(4, 16);
  EXPECT_EQ(blocks.blocks_for_tokens(0), 0);
  EXPECT_EQ(blocks.blocks_for_tokens(1), 1);
  EXPECT_EQ(blocks.blocks_for_tokens(16), 1);
  EXPECT_EQ(blocks.blocks_for_tokens(17), 2);
  EXPECT_EQ(blocks.blocks_for_tokens(INT64_MAX), INT64_MAX / 16 + 1);  // no overflow
  EXPECT_EQ(blocks.pool_capacity_tokens(), 64);
  expect_error([&] { blocks.blocks_for_tokens(-1); }, "negative", Errc::invalid_argument);
}

TEST(BlockManager, CapacityAccountingIsExact) {
  BlockManager blocks(10, 16);
  EXPECT_TRUE(blocks.can_allocate(160));
  EXPECT_FALSE(blocks.can_allocate(161));

  blocks.allocate(1, 17);  // 2 blocks
  EXPECT_EQ(blocks.block_table(1).size(), 2u);
  EXPECT_EQ(blocks.capacity_tokens(1), 32);
  EXPECT_EQ(blocks.num_free_blocks(), 8);
  EXPECT_DOUBLE_EQ(blocks.usage(), 0.2);

  EXPECT_EQ(blocks.blocks_needed(1, 32), 0);
  EXPECT_EQ(blocks.blocks_needed(1, 33), 1);
  blocks.ensure_capacity(1, 32);  // already holds 32: nothing changes
  EXPECT_EQ(blocks.num_free_blocks(), 8);
  blocks.ensure_capacity(1, 33);
  EXPECT_EQ(blocks.block_table(1).size(), 3u);
  blocks.ensure_capacity(1, 5);  // never shrinks
  EXPECT_EQ(blocks.block_table(1).size(), 3u);

  blocks.allocate(2, 0);  // an empty table is a sequence too
  EXPECT_TRUE(blocks.contains(2));
  EXPECT_EQ(blocks.block_table(2).size(), 0u);
  blocks.ensure_capacity(2, 7 * 16);  // exactly the rest of the pool
  EXPECT_EQ(blocks.num_free_blocks(), 0);
  EXPECT_DOUBLE_EQ(blocks.usage(), 1.0);
  expect_exact_accounting(blocks, {1, 2});

  blocks.free(1);
  blocks.free(2);
  EXPECT_EQ(blocks.num_free_blocks(), 10);
  expect_exact_accounting(blocks, {});
}

TEST(BlockManager, GrowingPastTheFreeBlocksChangesNothing) {
  BlockManager blocks(4, 4);
  blocks.allocate(7, 8);
  expect_error([&] { blocks.ensure_capacity(7, 8 + 3 * 4); }, "need 3 blocks but only 2", Errc::internal);
  EXPECT_EQ(blocks.block_table(7).size(), 2u);
  EXPECT_EQ(blocks.num_free_blocks(), 2);
  expect_error([&] { blocks.allocate(8, 13); }, "only 2 of 4 are free", Errc::internal);
  EXPECT_FALSE(blocks.contains(8));
  expect_exact_accounting(blocks, {7});
}

TEST(BlockManager, MisuseIsAnInternalError) {
  BlockManager blocks(4, 4);
  blocks.allocate(1, 4);
  expect_error([&] { blocks.allocate(1, 4); }, "already allocated", Errc::internal);
  blocks.free(1);
  expect_error([&] { blocks.free(1); }, "freed twice", Errc::internal);
  expect_error([&] { blocks.ensure_capacity(1, 4); }, "unknown sequence 1", Errc::internal);
  expect_error([&] { blocks.block_table(99); }, "unknown sequence 99", Errc::internal);
  expect_error([&] { blocks.fork(99, 100); }, "unknown sequence 99", Errc::internal);
  expect_error([&] { blocks.ref_count(4); }, "outside [0, 4)", Errc::invalid_argument);
  expect_exact_accounting(blocks, {});
}

TEST(BlockManager, ForkSharesBlocksUntilTheLastReferenceGoes) {
  BlockManager blocks(8, 4);
  blocks.allocate(1, 10);  // 3 blocks
  blocks.fork(1, 2);
  ASSERT_EQ(blocks.block_table(2).size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(blocks.block_table(1)[i], blocks.block_table(2)[i]);
    EXPECT_EQ(blocks.ref_count(blocks.block_table(1)[i]), 2);
  }
  EXPECT_EQ(blocks.num_free_blocks(), 5);  // sharing costs nothing
  expect_error([&] { blocks.fork(1, 2); }, "already exists", Errc::internal);

  blocks.ensure_capacity(2, 13);  // the child grows with a fresh block of its own
  int32_t own = blocks.block_table(2)[3];
  EXPECT_EQ(blocks.ref_count(own), 1);
  EXPECT_EQ(blocks.num_free_blocks(), 4);
  expect_exact_accounting(blocks, {1, 2});

  blocks.free(1);  // the shared blocks stay: the child still holds them
  EXPECT_EQ(blocks.num_free_blocks(), 4);
  EXPECT_EQ(blocks.ref_count(blocks.block_table(2)[0]), 1);
  expect_exact_accounting(blocks, {2});
  blocks.free(2);
  EXPECT_EQ(blocks.num_free_blocks(), 8);
  expect_exact_accounting(blocks, {});
}

TEST(BlockManager, FreedBlocksAreReusedLast) {
  BlockManager blocks(4, 1);
  blocks.allocate(1, 1);
  int32_t first = blocks.block_table(1)[0];
  blocks.free(1);
  blocks.allocate(2, 3);  // takes the three never-used blocks before the freed one
  for (int32_t block : blocks.block_table(2)) EXPECT_NE(block, first);
  blocks.allocate(3, 1);
  EXPECT_EQ(blocks.block_table(3)[0], first);
}

// Thousands of random allocate / grow / fork / free operations (fixed seed); the accounting is
// recounted after every one, and everything returns to the pool at the end.
TEST(BlockManager, RandomTraceKeepsExactAccounting) {
  const int32_t block_size = 4;
  BlockManager blocks(48, block_size);
  std::mt19937 rng(1234);
  std::map<SeqId, int64_t> tokens;  // live sequences and the tokens each should hold
  SeqId next_id = 0;
  int64_t forks = 0, refusals = 0;
  for (int op = 0; op < 5000; ++op) {
    int kind = int(rng() % 10);
    if (kind < 3 || tokens.empty()) {
      int64_t n = int64_t(rng() % 40);
      if (blocks.can_allocate(n)) {
        blocks.allocate(next_id, n);
        tokens[next_id++] = n;
      } else {
        ++refusals;
        expect_error([&] { blocks.allocate(next_id, n); }, "are free", Errc::internal);
      }
    } else {
      auto it = std::next(tokens.begin(), long(rng() % tokens.size()));
      if (kind < 7) {
        int64_t total = it->second + int64_t(rng() % 9);
        if (blocks.blocks_needed(it->first, total) <= blocks.num_free_blocks()) {
          blocks.ensure_capacity(it->first, total);
          it->second = total;
        } else {
          ++refusals;
        }
      } else if (kind == 7) {
        blocks.fork(it->first, next_id);
        tokens[next_id++] = it->second;
        ++forks;
      } else {
        blocks.free(it->first);
        tokens.erase(it);
      }
    }
    std::set<SeqId> live;
    for (const auto& [seq, n] : tokens) {
      live.insert(seq);
      ASSERT_EQ(blocks.capacity_tokens(seq), blocks.blocks_for_tokens(n) * block_size);  // no more, no less
    }
    expect_exact_accounting(blocks, live);
    if (HasFailure()) return;
  }
  EXPECT_GT(forks, 100);
  EXPECT_GT(refusals, 10);  // the pool did run full
  for (const auto& [seq, n] : tokens) blocks.free(seq);
  EXPECT_EQ(blocks.num_free_blocks(), blocks.num_blocks());
  expect_exact_accounting(blocks, {});
}

}  // namespace
}  // namespace kiln
