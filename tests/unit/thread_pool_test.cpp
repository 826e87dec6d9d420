#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/thread_pool.h"
#include "kiln/error.h"

namespace kiln {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, RefusesAbsurdThreadCounts) {
  EXPECT_THROW(ThreadPool(100000), Error);
  ThreadPool defaulted(0);
  EXPECT_GE(defaulted.size(), 1);
}

}  // namespace
}  // namespace kiln
