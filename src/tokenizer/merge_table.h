// The BPE merge table, (left id, right id) -> (rank, merged id), and the loop that applies it.
//
// The table is looked up several times per byte of input: open addressing with linear probing in
// one flat array, so a lookup is one hash and usually one cache line.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

namespace kiln {

class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t result;  // the id of the merged token
  };

  explicit MergeTable(size_t expected_entries = 0) {
    // At most half full, so probe runs stay short.
    slots_.assign(std::bit_ceil(std::max<size_t>(16, expected_entries * 2)), Slot{kEmpty, {}});
    shift_ = 64 - std::countr_zero(slots_.size());
  }

  // Inserts unless the pair is already there (the first, best-ranked merge of a pair wins).
  void insert(int32_t left, int32_t right, Merge merge) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    const uint64_t key = pair_key(left, right);
    for (size_t i = home(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, merge};
        ++size_;
        return;
      }
    }
  }

  const Merge* find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t i = home(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  // Token ids are non-negative int32, so no real pair has all 64 bits set.
  static constexpr uint64_t kEmpty = ~uint64_t(0);

  static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
  size_t home(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{kEmpty, {}});
    shift_ = 64 - std::countr_zero(slots_.size());
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key != kEmpty) insert(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.merge);
    }
  }

  std::vector<Slot> slots_;
  int shift_ = 0;
  size_t size_ = 0;
};

// Merges `ids` in place until no adjacent pair has a merge: each step merges the pair with the
// lowest rank, the leftmost of equal ones (Hugging Face tokenizers and llama.cpp order merges
// the same way).
void apply_merges(const MergeTable& table, std::vector<int32_t>& ids);

}  // namespace kiln
