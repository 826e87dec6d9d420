// argmax and sample_rows against host references that make the same draws: the same uniform for
// the candidate walk, the same Gumbel noise for the whole-row draw.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/sampling.h"

namespace kiln::gputest {
namespace {

using cuda::RowSampling;

// The whole row's softmax mass summed in the kernel's order (1024 threads striding the row, a
// butterfly within each warp, then the 32 warps in turn), so that the top-p cut is compared
// against the same bits.
float block_order_sum(const std::vector<float>& terms) {
  std::vector<float> thread(1024, 0.0f);
  for (size_t i = 0; i < terms.size(); ++i) thread[i % 1024] += terms[i];
  float total = 0.0f;
  for (int w = 0; w < 32; ++w) {
    std::vector<float> a(thread.begin() + w * 32, thread.begin() + (w + 1) * 32);
    for (int off = 16; off > 0; off >>= 1) {
      std::vector<float> b(32);
      for (int l = 0; l < 32; ++l) b[size_t(l)] = a[size_t(l)] + a[size_t(l ^ off)];
      a = b;
    }
    total += a[0];
  }
  return total;
}

// sampling.h's contract on the host, for one row (modified: the penalties).
int32_t host_sample(std::vector<float> row, const RowSampling& p, const std::vector<int32_t>& pen_ids,
                    const std::vector<int32_t>& pen_counts) {
  const int64_t vocab = int64_t(row.size());
  for (int j = p.pen_begin; j < p.pen_end; ++j) {
    float& l = row[size_t(pen_ids[size_t(j)])];
    if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * float(pen_counts[size_t(j)]);
  }
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(row[size_t(i)]) && (best < 0 || row[size_t(i)] > row[size_t(best)])) best = i;
  if (p.temperature <= 0 || best < 0 || !(row[size_t(best)] > -INFINITY) || !(row[size_t(best)] < INFINITY))
    return best < 0 ? 0 : int32_t(best);
  const float top = row[size_t(best)], inv_t = 1.0f / p.temperature;
  auto weight = [&](float v) { return v == top ? 1.0f : std::exp((v - top) * inv_t); };
  const float log_floor = p.min_p > 0 ? std::log(p.min_p) : -INFINITY;
  auto gumbel = [&] {
    int64_t pick = -1;
    float pick_key = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const float z = (row[size_t(i)] - top) * inv_t;
      if (!(z >= log_floor)) continue;
      const float key = z + cuda::sample_gumbel(p.seed, p.counter, i);
      if (pick < 0 || key > pick_key) pick = i, pick_key = key;
    }
    return int32_t(pick < 0 ? 0 : pick);
  };
  const bool k_off = p.top_k <= 0 || p.top_k >= vocab;
  if (k_off && p.top_p >= 1.0f) return gumbel();
  std::vector<int32_t> idx;
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(row[size_t(i)])) idx.push_back(int32_t(i));
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
  const int64_t k = std::min<int64_t>(vocab, k_off || p.top_k > cuda::kSampleMaxK ? cuda::kSampleMaxK : p.top_k);
  const int64_t n = std::min<int64_t>(k, int64_t(idx.size()));
  float total = 0;
  if (k_off) {
    std::vector<float> terms(row.size(), 0.0f);
    for (size_t i = 0; i < row.size(); ++i)
      if (!std::isnan(row[i])) terms[i] = weight(row[i]);
    total = block_order_sum(terms);
  } else {
    for (int64_t i = 0; i < n; ++i) total += weight(row[size_t(idx[size_t(i)])]);
  }
  int64_t n_keep = -1;
  float kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept += weight(row[size_t(idx[size_t(i)])]);
    if (kept >= p.top_p * total) {
      n_keep = i + 1;
      break;
    }
  }
  if (n_keep < 0 && !k_off) n_keep = n;
  if (n_keep < 0) return gumbel();
  int64_t cut = 1;
  while (cut < n_keep && weight(row[size_t(idx[size_t(cut)])]) >= p.min_p) ++cut;
  kept = 0;
  for (int64_t i = 0; i < cut; ++i) kept += weight(row[size_t(idx[size_t(i)])]);
  const float target = cuda::sample_uniform(p.seed, p.counter) * kept;
  float acc = 0;
  for (int64_t i = 0; i < cut; ++i) {
    acc += weight(row[size_t(idx[size_t(i)])]);
    if (acc > target) return idx[size_t(i)];
  }
  return idx[size_t(cut - 1)];
}

// Runs sample_rows on `logits` (rows x vocab) with one RowSampling a row, penalties optional.
std::vector<int32_t> device_sample(const std::vector<float>& logits, int64_t vocab, const std::vector<RowSampling>& ps,
                                   const std::vector<int32_t>& pen_ids = {}, const std::vector<int32_t>& pen_counts = {}) {
  DeviceBuffer<float> d(logits);
  DeviceBuffer<RowSampling> dp(ps);
  DeviceBuffer<int32_t> ids(std::max<size_t>(1, pen_ids.size())), counts(ids.size());
  if (!pen_ids.empty()) {
    ids.upload(pen_ids);
    counts.upload(pen_counts);
  }
  DeviceBuffer<int32_t> out(ps.size());
  out.poison();
  cuda::sample_rows(d.data(), int64_t(ps.size()), vocab, dp.data(), ids.data(), counts.data(), out.data(), nullptr);
  return out.to_host();
}

// Each row of `logits` under every parameter set, against host_sample.
void check_all(const std::vector<float>& logits, int64_t vocab, const std::vector<RowSampling>& sets,
               const char* what) {
  const int64_t rows = int64_t(logits.size()) / vocab;
  for (const RowSampling& base : sets) {
    std::vector<RowSampling> ps(size_t(rows), base);
    for (int64_t r = 0; r < rows; ++r) ps[size_t(r)].counter = uint64_t(r) * 7 + 3;
    const std::vector<int32_t> got = device_sample(logits, vocab, ps);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      EXPECT_EQ(got[size_t(r)], host_sample(row, ps[size_t(r)], {}, {}))
          << what << " vocab " << vocab << " row " << r << " T " << base.temperature << " k " << base.top_k << " p "
          << base.top_p << " min_p " << base.min_p;
    }
  }
}

RowSampling rs(float t, int k, float top_p, float min_p, uint64_t seed) {
  RowSampling p;
  p.temperature = t, p.top_k = k, p.top_p = top_p, p.min_p = min_p, p.seed = seed;
  return p;
}

const std::vector<RowSampling> kSets = {
    rs(1.0f, 40, 0.9f, 0.0f, 1),   rs(0.7f, 0, 0.95f, 0.0f, 2), rs(1.3f, 1, 1.0f, 0.0f, 3),
    rs(1.0f, 2000, 1.0f, 0.0f, 4), rs(1.0f, 0, 1.0f, 0.0f, 5),  rs(0.8f, 0, 1.0f, 0.05f, 6),
    rs(0.8f, 40, 0.95f, 0.05f, 7), rs(0.0f, 0, 1.0f, 0.0f, 8),  rs(1.0f, 100000, 0.5f, 0.0f, 9)};

TEST(GpuSampling, ArgmaxMatchesHostWithTies) {
  KILN_REQUIRE_GPU();
  const int64_t rows = 3, vocab = 128256;
  auto logits = random_bf16_values(size_t(rows * vocab), 17, 5.0f);
  logits[size_t(vocab + 500)] = 9.0f;  // a tie in row 1: the lower id wins
  logits[size_t(vocab + 90000)] = 9.0f;
  DeviceBuffer<float> d(logits);
  DeviceBuffer<int32_t> out(rows);
  out.poison();
  cuda::argmax(d.data(), rows, vocab, out.data(), nullptr);
  auto got = out.to_host();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    EXPECT_EQ(got[size_t(r)], int32_t(std::max_element(row, row + vocab) - row)) << "row " << r;
  }
}

// The split form (a few rows, each over several blocks, the last block of a row reducing): rows
// 1..kArgmaxSplitRows of Llama-3's vocabulary and odd ones, a tie across two splits (the lower id
// wins), the maximum in the last logit, NaN logits, an all-NaN row (id 0, as the one-block form),
// and a second call on the same workspace (its tickets reset).
TEST(GpuSampling, ArgmaxSplitMatchesHost) {
  KILN_REQUIRE_GPU();
  DeviceBuffer<float> values(size_t(cuda::kArgmaxSplitRows) * cuda::kArgmaxMaxSplits);
  DeviceBuffer<int32_t> ids(values.size());
  DeviceBuffer<uint32_t> tickets(size_t(cuda::kArgmaxSplitRows));
  tickets.zero();
  const cuda::ArgmaxWorkspace ws{values.data(), ids.data(), tickets.data()};
  for (int64_t vocab : {int64_t(128256), int64_t(151936), int64_t(5003), int64_t(97)}) {
    for (int64_t rows : {int64_t(1), int64_t(3), cuda::kArgmaxSplitRows}) {
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << " rows " << rows);
      auto logits = random_bf16_values(size_t(rows * vocab), uint32_t(vocab + rows), 5.0f);
      logits[size_t(vocab - 1)] = 9.0f;  // row 0: the last logit
      if (rows > 1) {
        logits[size_t(vocab + 3)] = 9.0f;  // row 1: a tie, far apart
        logits[size_t(vocab + vocab - 2)] = 9.0f;
        logits[size_t(vocab + 5)] = NAN;
      }
      if (rows > 2)
        for (int64_t i = 0; i < vocab; ++i) logits[size_t(2 * vocab + i)] = NAN;
      DeviceBuffer<float> d(logits);
      DeviceBuffer<int32_t> out{static_cast<size_t>(rows)}, plain{static_cast<size_t>(rows)};
      for (int call = 0; call < 2; ++call) {
        out.poison();
        cuda::argmax(d.data(), rows, vocab, out.data(), nullptr, ws);
        cuda::argmax(d.data(), rows, vocab, plain.data(), nullptr);
        const auto got = out.to_host();
        EXPECT_EQ(got, plain.to_host());
        for (int64_t r = 0; r < rows; ++r) {
          const float* row = logits.data() + r * vocab;
          int32_t want = 0;  // the first non-NaN maximum; 0 for an all-NaN row
          for (int64_t i = 0; i < vocab; ++i)
            if (!std::isnan(row[i]) && (std::isnan(row[want]) || row[i] > row[want])) want = int32_t(i);
          EXPECT_EQ(got[size_t(r)], want) << "row " << r << " call " << call;
        }
      }
      EXPECT_EQ(tickets.to_host(), std::vector<uint32_t>(size_t(cuda::kArgmaxSplitRows), 0u));
    }
  }
}

// Distinct logits (a permutation of a grid), so the order, hence the choice, is unambiguous; a
// Llama-3-sized row of random logits besides.
TEST(GpuSampling, RowsMatchHostReference) {
  KILN_REQUIRE_GPU();
  const int64_t rows = 7, vocab = 5003;
  std::vector<float> logits(size_t(rows * vocab));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < vocab; ++i) logits[size_t(r * vocab + i)] = float((i * 7919 + r * 31) % vocab) * 0.003f;
  check_all(logits, vocab, kSets, "grid");
  check_all(random_bf16_values(size_t(2 * 128256), 23, 3.0f), 128256, kSets, "random");
}

// Heavy ties (6 distinct values over the whole row): the cut falls inside a tie, which must go to
// the lowest ids (the host's stable sort); a nucleus larger than the candidates falls back to the
// whole row.
TEST(GpuSampling, RowsHeavyTies) {
  KILN_REQUIRE_GPU();
  for (int64_t vocab : {int64_t(5003), int64_t(37), int64_t(1024), int64_t(3000)}) {
    const int64_t rows = 5;
    std::vector<float> logits(size_t(rows * vocab));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < vocab; ++i)
        logits[size_t(r * vocab + i)] = r == 4 ? 1.5f : float(((i * 7919 + r * 31) % vocab) % 6) * 0.5f;
    std::vector<RowSampling> sets = kSets;
    sets.push_back(rs(2.0f, 3, 0.0f, 0.0f, 10));
    check_all(logits, vocab, sets, "ties");
  }
}

// NaN, -inf and +inf logits: the kernel must finish and pick a valid, non-NaN id.
TEST(GpuSampling, RowsNonFiniteLogits) {
  KILN_REQUIRE_GPU();
  const int64_t rows = 5, vocab = 2053;
  std::vector<float> logits(size_t(rows * vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    logits[size_t(0 * vocab + i)] = std::nanf("");                            // all NaN
    logits[size_t(1 * vocab + i)] = -INFINITY;                                // all -inf
    logits[size_t(2 * vocab + i)] = i % 3 == 0 ? std::nanf("") : -INFINITY;   // NaN and -inf
    logits[size_t(3 * vocab + i)] = i % 2 ? std::nanf("") : float(i % 7);     // half NaN
    logits[size_t(4 * vocab + i)] = i == 1234 ? INFINITY : float(i % 5);      // one +inf
  }
  for (const RowSampling& base : kSets) {
    std::vector<RowSampling> ps(size_t(rows), base);
    const std::vector<int32_t> got = device_sample(logits, vocab, ps);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_GE(got[size_t(r)], 0) << "row " << r;
      ASSERT_LT(got[size_t(r)], vocab) << "row " << r;
      if (r >= 1) {
        EXPECT_FALSE(std::isnan(logits[size_t(r * vocab + got[size_t(r)])])) << "row " << r;
      }
    }
    EXPECT_EQ(got[4], 1234);
  }
}

// Penalties on the device, then greedy and sampled draws, against the host; ids out of range in
// the penalty list are ignored.
TEST(GpuSampling, PenaltiesMatchHost) {
  KILN_REQUIRE_GPU();
  const int64_t rows = 4, vocab = 3001;
  auto logits = random_bf16_values(size_t(rows * vocab), 31, 2.0f);
  std::vector<int32_t> ids, counts;
  std::vector<RowSampling> ps;
  for (int64_t r = 0; r < rows; ++r) {
    RowSampling p = rs(r % 2 ? 0.0f : 0.9f, r == 2 ? 50 : 0, 1.0f, 0.0f, 40 + uint64_t(r));
    p.repetition_penalty = 1.3f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.25f;
    p.pen_begin = int32_t(ids.size());
    // Penalize the row's current argmax (so greedy must move) and a few others.
    const float* row = logits.data() + r * vocab;
    ids.push_back(int32_t(std::max_element(row, row + vocab) - row));
    counts.push_back(3);
    for (int32_t id : {7, 100, 2999, -5, 5000}) ids.push_back(id), counts.push_back(1);
    p.pen_end = int32_t(ids.size());
    ps.push_back(p);
  }
  const std::vector<int32_t> got = device_sample(logits, vocab, ps, ids, counts);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    RowSampling p = ps[size_t(r)];
    // The host reference indexes without a bounds check: drop the out-of-range ids as the kernel does.
    std::vector<int32_t> hid, hcount;
    for (int j = p.pen_begin; j < p.pen_end; ++j)
      if (ids[size_t(j)] >= 0 && ids[size_t(j)] < vocab) hid.push_back(ids[size_t(j)]), hcount.push_back(counts[size_t(j)]);
    p.pen_begin = 0, p.pen_end = int32_t(hid.size());
    EXPECT_EQ(got[size_t(r)], host_sample(row, p, hid, hcount)) << "row " << r;
  }
}

// Over many draws of one row the whole-row (Gumbel) path's frequencies follow the softmax at T.
TEST(GpuSampling, GumbelFrequenciesFollowSoftmax) {
  KILN_REQUIRE_GPU();
  const int64_t vocab = 8, draws = 20000;
  const std::vector<float> one = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f, 1.5f, 0.25f};
  std::vector<float> logits;
  std::vector<RowSampling> ps;
  for (int64_t d = 0; d < draws; ++d) {
    logits.insert(logits.end(), one.begin(), one.end());
    RowSampling p = rs(0.8f, 0, 1.0f, 0.0f, 99);
    p.counter = uint64_t(d);
    ps.push_back(p);
  }
  const std::vector<int32_t> got = device_sample(logits, vocab, ps);
  std::vector<double> freq(static_cast<size_t>(vocab), 0.0), prob(static_cast<size_t>(vocab), 0.0);
  for (int32_t t : got) freq[size_t(t)] += 1.0 / double(draws);
  double z = 0;
  for (int64_t i = 0; i < vocab; ++i) z += prob[size_t(i)] = std::exp(double(one[size_t(i)]) / 0.8);
  for (int64_t i = 0; i < vocab; ++i) EXPECT_NEAR(freq[size_t(i)], prob[size_t(i)] / z, 0.01) << "token " << i;
}

}  // namespace
}  // namespace kiln::gputest
