#include "runtime/block_manager.h"

#include <algorithm>
#include <utility>

#include "core/check.h"

namespace kiln {

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size) : num_blocks_(num_blocks), block_size_(block_size) {
  KILN_CHECK(num_blocks > 0, invalid_argument, "the KV cache needs at least one block, got {}", num_blocks);
  KILN_CHECK(block_size > 0, invalid_argument, "KV block size must be positive, got {}", block_size);
  ref_counts_.assign(size_t(num_blocks), 0);
  for (int32_t b = 0; b < num_blocks; ++b) free_blocks_.push_back(b);
}

int64_t BlockManager::blocks_for_tokens(int64_t n_tokens) const {
  KILN_CHECK(n_tokens >= 0, invalid_argument, "token count must not be negative, got {}", n_tokens);
  return n_tokens / block_size_ + (n_tokens % block_size_ != 0);  // no overflow near INT64_MAX
}

bool BlockManager::can_allocate(int64_t n_tokens) const { return blocks_for_tokens(n_tokens) <= num_free_blocks(); }

const std::vector<int32_t>& BlockManager::table_of(SeqId seq) const {
  auto it = tables_.find(seq);
  KILN_CHECK(it != tables_.end(), internal, "KV blocks: unknown sequence {} (never allocated, or already freed)", seq);
  return it->second;
}

std::vector<int32_t>& BlockManager::table_of(SeqId seq) {
  return const_cast<std::vector<int32_t>&>(std::as_const(*this).table_of(seq));
}

int64_t BlockManager::blocks_needed(SeqId seq, int64_t total_tokens) const {
  int64_t have = int64_t(table_of(seq).size());
  return std::max<int64_t>(0, blocks_for_tokens(total_tokens) - have);
}

int64_t BlockManager::capacity_tokens(SeqId seq) const { return int64_t(table_of(seq).size()) * block_size_; }

std::span<const int32_t> BlockManager::block_table(SeqId seq) const { return table_of(seq); }

int32_t BlockManager::ref_count(int32_t block) const {
  KILN_CHECK(block >= 0 && block < num_blocks_, invalid_argument, "KV block id {} outside [0, {})", block, num_blocks_);
  return ref_counts_[size_t(block)];
}

void BlockManager::take_free_blocks(std::vector<int32_t>& table, int64_t n) {
  KILN_CHECK(n <= num_free_blocks(), internal, "KV blocks: need {} blocks but only {} of {} are free", n,
             num_free_blocks(), num_blocks_);
  table.reserve(table.size() + size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t block = free_blocks_.front();
    free_blocks_.pop_front();
    ref_counts_[size_t(block)] = 1;
    table.push_back(block);
  }
}

std::span<const int32_t> BlockManager::allocate(SeqId seq, int64_t n_tokens) {
  KILN_CHECK(!contains(seq), internal, "KV blocks: sequence {} is already allocated", seq);
  int64_t n = blocks_for_tokens(n_tokens);
  KILN_CHECK(n <= num_free_blocks(), internal, "KV blocks: sequence {} needs {} blocks but only {} of {} are free", seq,
             n, num_free_blocks(), num_blocks_);
  std::vector<int32_t>& table = tables_[seq];
  take_free_blocks(table, n);
  return table;
}

std::span<const int32_t> BlockManager::ensure_capacity(SeqId seq, int64_t total_tokens) {
  std::vector<int32_t>& table = table_of(seq);  // one lookup: this runs for every decode of every step
  take_free_blocks(table, std::max<int64_t>(0, blocks_for_tokens(total_tokens) - int64_t(table.size())));
  return table;
}

void BlockManager::fork(SeqId parent, SeqId child) {
  KILN_CHECK(!contains(child), internal, "KV blocks: fork target {} already exists", child);
  std::vector<int32_t> shared = table_of(parent);
  for (int32_t block : shared) ++ref_counts_[size_t(block)];
  tables_.emplace(child, std::move(shared));
}

void BlockManager::release(int32_t block) {
  int32_t& count = ref_counts_[size_t(block)];
  KILN_CHECK(count > 0, internal, "KV blocks: block {} released with reference count {}", block, count);
  if (--count == 0) free_blocks_.push_back(block);
}

void BlockManager::free(SeqId seq) {
  auto it = tables_.find(seq);
  KILN_CHECK(it != tables_.end(), internal, "KV blocks: free of unknown sequence {} (freed twice?)", seq);
  // Last block first, so a sequence's prefix (the part most likely shared or cached) is reused last.
  for (auto block = it->second.rbegin(); block != it->second.rend(); ++block) release(*block);
  tables_.erase(it);
}

void BlockManager::check_invariants() const {
  std::vector<int32_t> counted(size_t(num_blocks_), 0);
  for (const auto& [seq, table] : tables_) {
    for (int32_t block : table) {
      KILN_CHECK(block >= 0 && block < num_blocks_, internal, "KV blocks: sequence {} holds bad block id {}", seq,
                 block);
      ++counted[size_t(block)];
    }
  }
  std::vector<bool> on_free_list(size_t(num_blocks_), false);
  for (int32_t block : free_blocks_) {
    KILN_CHECK(block >= 0 && block < num_blocks_, internal, "KV blocks: bad id {} on the free list", block);
    KILN_CHECK(!on_free_list[size_t(block)], internal, "KV blocks: block {} is on the free list twice", block);
    on_free_list[size_t(block)] = true;
  }
  for (int32_t b = 0; b < num_blocks_; ++b) {
    KILN_CHECK(counted[size_t(b)] == ref_counts_[size_t(b)], internal,
               "KV blocks: block {} has reference count {} but {} tables hold it", b, ref_counts_[size_t(b)],
               counted[size_t(b)]);
    KILN_CHECK(on_free_list[size_t(b)] == (counted[size_t(b)] == 0), internal,
               "KV blocks: block {} is {} the free list with {} references", b,
               on_free_list[size_t(b)] ? "on" : "off", counted[size_t(b)]);
  }
}

}  // namespace kiln
