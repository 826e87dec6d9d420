#include "tokenizer/merge_table.h"

#include <climits>
#include <cstddef>

namespace kiln {
namespace {

// Pieces up to this many symbols (nearly all of them: words, numbers, short runs) use a linear
// scan over the ranks of adjacent pairs; longer ones a heap, so that a megabyte of spaces stays
// O(n log n). Both pick the same merge at every step.
constexpr size_t kLinearScanMax = 64;

void merge_short(const MergeTable& table, std::vector<int32_t>& ids) {
  // rank[i], result[i]: the merge of ids[i] and ids[i + 1], INT_MAX when there is none.
  int32_t rank[kLinearScanMax], result[kLinearScanMax];
  size_t n = ids.size();
  auto look_up = [&](size_t i) {
    const MergeTable::Merge* merge = table.find(ids[i], ids[i + 1]);
    rank[i] = merge ? merge->rank : INT_MAX;
    result[i] = merge ? merge->result : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) look_up(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;  // strict: the leftmost of equal ranks wins
    }
    if (rank[best] == INT_MAX) break;
    ids[best] = result[best];
    ids.erase(ids.begin() + std::ptrdiff_t(best) + 1);
    // The pairs right of the merged one move left by one (none when it was the last pair).
    if (best + 2 < n) {
      std::copy(rank + best + 2, rank + n - 1, rank + best + 1);
      std::copy(result + best + 2, result + n - 1, result + best + 1);
    }
    --n;
    if (best > 0) look_up(best - 1);
    if (best + 1 < n) look_up(best);
  }
}

void merge_long(const MergeTable& table, std::vector<int32_t>& ids) {
  // Symbols form a doubly linked list over the original positions; a merged-away symbol gets id -1.
  struct Symbol {
    int32_t id, prev, next;
  };
  struct Candidate {
    int32_t rank, left, left_id, right_id, result;  // left: the left symbol's position
  };
  // A min-heap on (rank, left): the best merge first, the leftmost on ties.
  auto worse = [](const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; };
  const int32_t n = int32_t(ids.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) symbols[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1};
  std::vector<Candidate> heap;
  heap.reserve(n);
  auto consider = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const Symbol& l = symbols[left];
    const MergeTable::Merge* merge = table.find(l.id, symbols[l.next].id);
    if (merge == nullptr) return;
    heap.push_back({merge->rank, left, l.id, symbols[l.next].id, merge->result});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.left];
    // Stale when either side has merged since: a symbol's id changes with every merge it takes
    // part in (its bytes grow), and its right neighbour changes only by such a merge.
    if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
    Symbol& right = symbols[left.next];
    left.id = c.result;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.id = -1;
    consider(left.prev);
    consider(c.left);
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);  // symbol 0 is never merged away
}

}  // namespace

void apply_merges(const MergeTable& table, std::vector<int32_t>& ids) {
  if (ids.size() < 2) return;
  if (ids.size() <= kLinearScanMax) {
    merge_short(table, ids);
  } else {
    merge_long(table, ids);
  }
}

}  // namespace kiln
