// The paged KV-cache allocator: a pool of fixed-size blocks (block_size tokens each), a free list,
// a reference count per block and a block table per sequence, as in vLLM's PagedAttention block
// manager and nano-vllm's block_manager.py (without the prefix-cache hash, which can be layered
// on the reference counts later). Pure bookkeeping: it never touches device memory; the backend
// maps block ids to K/V storage.
//
// Accounting is exact: a block is either on the free list (ref count 0) or referenced by at
// least one block table (ref count = number of tables holding it). check_invariants() proves it.
// Misuse (an unknown sequence, freeing twice, growing past the free blocks) is a bug in the
// caller and throws kiln::Error(Errc::internal); impossible sizes throw invalid_argument.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

namespace kiln {

using SeqId = int64_t;

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size);

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free_blocks() const { return int32_t(free_blocks_.size()); }
  int32_t num_used_blocks() const { return num_blocks_ - num_free_blocks(); }
  // Fraction of blocks in use, in [0, 1] (what vLLM exports as kv_cache_usage_perc).
  double usage() const { return double(num_used_blocks()) / double(num_blocks_); }
  // Tokens the whole pool holds: the most any one sequence can ever have.
  int64_t pool_capacity_tokens() const { return int64_t(num_blocks_) * block_size_; }

  // Blocks that n_tokens tokens occupy (rounded up).
  int64_t blocks_for_tokens(int64_t n_tokens) const;
  // Whether a new sequence of n_tokens tokens fits in the free blocks now.
  bool can_allocate(int64_t n_tokens) const;
  // Blocks `seq` must add so that it holds total_tokens (0 when it already does).
  int64_t blocks_needed(SeqId seq, int64_t total_tokens) const;
  // Tokens `seq`'s current blocks hold.
  int64_t capacity_tokens(SeqId seq) const;

  // Both return `seq`'s block table (as block_table() does), saving the caller another lookup.
  // Creates `seq` with blocks for n_tokens tokens (0 is allowed: an empty table).
  std::span<const int32_t> allocate(SeqId seq, int64_t n_tokens);
  // Appends blocks to `seq`'s table until it holds total_tokens; never shrinks. All or nothing:
  // throws internal, changing nothing, when the free blocks do not suffice (ask blocks_needed).
  std::span<const int32_t> ensure_capacity(SeqId seq, int64_t total_tokens);
  // `child` (new) shares every block of `parent` (each ref count + 1): prefix sharing / parallel
  // sampling. Writing into a shared, partly filled last block needs copy-on-write, which is the
  // caller's job (see ref_count); ensure_capacity only ever appends fresh blocks.
  void fork(SeqId parent, SeqId child);
  // Drops `seq`'s references; a block whose count reaches zero returns to the free list.
  void free(SeqId seq);

  bool contains(SeqId seq) const { return tables_.contains(seq); }
  size_t num_sequences() const { return tables_.size(); }
  // Block ids of `seq`, position p lives in block_table[p / block_size] at slot p % block_size.
  // Valid until the next call that changes `seq` (calls on other sequences leave it valid).
  std::span<const int32_t> block_table(SeqId seq) const;
  int32_t ref_count(int32_t block) const;

  // Recounts everything from the block tables; throws internal on any mismatch. O(blocks + tables).
  void check_invariants() const;

 private:
  const std::vector<int32_t>& table_of(SeqId seq) const;
  std::vector<int32_t>& table_of(SeqId seq);
  void take_free_blocks(std::vector<int32_t>& table, int64_t n);
  void release(int32_t block);

  int32_t num_blocks_;
  int32_t block_size_;
  // FIFO: a freed block is reused last, so its contents survive longest (what a prefix cache
  // wants; nano-vllm's free_block_ids deque does the same).
  std::deque<int32_t> free_blocks_;
  std::vector<int32_t> ref_counts_;  // (num_blocks)
  std::unordered_map<SeqId, std::vector<int32_t>> tables_;
};

}  // namespace kiln
